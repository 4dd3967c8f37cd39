"""AWS Bedrock upstreams: SigV4 signing with the guard's credentials, event streams relayed and read."""
