"""llmgate's recipe for LangChain in Python (langchain-openai): a base URL and
an Idempotency-Key per call. The README's "LangChain (Python)" section is
this file.

NOT RUN by llmgate's tests (no Python package index there); only compiled.
Checked by reading langchain-openai's source: ChatOpenAI hands max_retries
to openai.OpenAI (it has no retry layer of its own, unlike LangChain.js), so
the OpenAI SDK's retries apply, and they obey x-should-retry; keyword
arguments of invoke() go into the payload passed to
client.chat.completions.create(), so extra_headers reaches the SDK.
"""

import os

from langchain_openai import ChatOpenAI

# max_retries here is the OpenAI SDK's (default 2), which retries only where
# llmgate says x-should-retry: true: leave it. Do not wrap the model in
# .with_retry(): that layer retries any exception, x-should-retry or not.
model = ChatOpenAI(
    model="gpt-4o-mini",
    base_url="http://127.0.0.1:8080/v1",
    api_key=os.environ["LLMGATE_API_KEY"],
)


def summarize(order_id: str, text: str):
    return model.invoke(
        [("user", f"Summarize: {text}")],
        extra_headers={"Idempotency-Key": f"order-{order_id}/summarize"},
    )
