"""AWS Bedrock's runtime API shapes: Converse (`/model/{id}/converse`) and the event stream its
streaming answers are framed in."""
