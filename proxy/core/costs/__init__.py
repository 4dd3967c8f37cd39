"""What each kind of part costs beyond its text: tool definitions, tool calls and results, images,
audio and files."""
