"""Gemini's generateContent and countTokens (Developer API and Vertex AI) as the core's chat view."""
