"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`): a chat request in
Anthropic's shape, with its content blocks, streaming events and error bodies."""
