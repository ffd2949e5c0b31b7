"""llmgate's recipe for the official Python SDK (openai): a base URL and an
Idempotency-Key per call. The README's "Python (openai)" section is this file.

NOT RUN by llmgate's tests (their machines reach no Python package index);
only compiled (e2e/recipes_test.go). Checked by reading openai-python's
source: _base_client.py's _should_retry obeys x-should-retry before any
status rule and waits Retry-After; a retry resends the same extra_headers;
the OpenAI client sets no _idempotency_header, so the SDK's own
idempotency_key request option sends no header at all.
"""

import os

from openai import OpenAI

# Leave max_retries at its default (2): the SDK retries exactly when llmgate
# answers x-should-retry: true (a 409 idempotency_key_in_flight, a 504
# client_deadline_exceeded), after Retry-After, with the same headers and so
# the same key. Every other failure llmgate has already retried, or it is
# permanent; it says x-should-retry: false, and the SDK raises at once.
client = OpenAI(base_url="http://127.0.0.1:8080/v1", api_key=os.environ["LLMGATE_API_KEY"])


def summarize(order_id: str, text: str):
    return client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": f"Summarize: {text}"}],
        extra_headers={"Idempotency-Key": f"order-{order_id}/summarize"},
    )


# What reaches the caller, unretried (x-should-retry: false):
#   openai.UnprocessableEntityError  422 idempotency_key_reused: the key was used
#                                    with another body, a bug in the caller
#   openai.InternalServerError       503 upstream_unavailable (breaker open) or
#                                    idempotency_store_unavailable: nothing ran;
#                                    retry later with the same key
#   openai.APIStatusError            410 idempotency_result_not_stored: served
#                                    once, too large to store; only a new key
#                                    runs it again (and pays again)
# and a 409 or 504 only once the SDK's retries are spent. err.status_code and
# err.code tell them apart.
