"""OpenAI's Responses API (`/v1/responses`): a chat request in another shape, with a bounded store of
past responses (previous_response_id) and its own streaming events."""
