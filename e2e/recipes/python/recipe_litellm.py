"""llmgate's recipe for LiteLLM's Python client (litellm.completion): a base
URL and an Idempotency-Key per call. The README's "LiteLLM" section is this
file.

NOT RUN by llmgate's tests (no Python package index there); only compiled.
Checked by reading LiteLLM's source: for an "openai/..." model, extra_headers
become the OpenAI SDK's extra_headers and max_retries (default 2) the SDK
client's, which obey x-should-retry; num_retries (or litellm.num_retries) is
LiteLLM's own layer around the call, which retries any openai.APIError
whatever x-should-retry says.
"""

import os

import litellm


def summarize(order_id: str, text: str):
    return litellm.completion(
        model="openai/gpt-4o-mini",  # openai/: any OpenAI-compatible server
        api_base="http://127.0.0.1:8080/v1",
        api_key=os.environ["LLMGATE_API_KEY"],
        messages=[{"role": "user", "content": f"Summarize: {text}"}],
        extra_headers={"Idempotency-Key": f"order-{order_id}/summarize"},
        num_retries=0,  # LiteLLM's own retries off; the SDK's (max_retries) stay
    )
