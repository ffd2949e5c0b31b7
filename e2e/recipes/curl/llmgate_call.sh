# llmgate's recipe for curl: a POSIX sh function. The README's "curl"
# section is this file; e2e/recipes_test.go runs it against the real gateway.
#
#   . llmgate_call.sh
#   llmgate_call KEY [CURL-ARGS...] < request.json > answer.json
#   llmgate_stream KEY [CURL-ARGS...] < request.json   # "stream": true
#
# POSTs a chat completion to llmgate ($LLMGATE_BASE_URL, its /v1 URL; client
# key $LLMGATE_API_KEY; $LLMGATE_PATH, /chat/completions unless set:
# LLMGATE_PATH=/responses for the Responses API) under the Idempotency-Key
# KEY, and retries it, with
# the same key, only when llmgate answers x-should-retry: true (a 409
# idempotency_key_in_flight, a 504 client_deadline_exceeded), after
# Retry-After; at most 3 tries. The body of the last answer goes to stdout;
# the status is 0 for a 2xx, else 22 (curl's --fail code).
#
# Not curl --retry: it re-sends 500, 502, 503 and 504 whatever x-should-retry
# says (each re-send of a failure llmgate already retried is a new round of
# upstream attempts), and never a 409. The body runs in a subshell, so its
# variables stay its own.
llmgate_call() (
  key=$1
  shift
  req=$(mktemp) hdr=$(mktemp) out=$(mktemp)
  cat >"$req"
  try=1
  while :; do
    : >"$hdr"
    code=$(curl -sS -o "$out" -D "$hdr" -w '%{http_code}' "$@" \
      -H "Authorization: Bearer $LLMGATE_API_KEY" \
      -H 'Content-Type: application/json' \
      -H "Idempotency-Key: $key" \
      --data-binary @"$req" "$LLMGATE_BASE_URL${LLMGATE_PATH:-/chat/completions}") || code=000
    if [ "$try" -ge 3 ] || ! grep -qi '^x-should-retry: *true' "$hdr"; then
      break
    fi
    secs=$(tr -d '\r' <"$hdr" | sed -n 's/^[Rr]etry-[Aa]fter: *\([0-9][0-9]*\)$/\1/p' | head -n 1)
    sleep "${secs:-0}"
    try=$((try + 1))
  done
  cat "$out"
  rm -f "$req" "$hdr" "$out"
  case $code in
  2??) exit 0 ;;
  *) exit 22 ;;
  esac
)

# llmgate_stream is llmgate_call for a stream: curl -N prints each event as
# llmgate sends it. The same key again is one upstream call and the same
# bytes: the committed stream replayed, or, while the first is still
# running on the same gateway, the events so far and then the rest live.
# Give the stream its own key (the same key with another body is a 422).
# One try: a non-2xx answer's JSON error is printed and the status is 22;
# when it said x-should-retry: true (a 409, the first call not yet
# answering), run it again with the same key.
llmgate_stream() (
  key=$1
  shift
  curl -sS -N --fail-with-body "$@" \
    -H "Authorization: Bearer $LLMGATE_API_KEY" \
    -H 'Content-Type: application/json' \
    -H "Idempotency-Key: $key" \
    --data-binary @- "$LLMGATE_BASE_URL${LLMGATE_PATH:-/chat/completions}"
)
