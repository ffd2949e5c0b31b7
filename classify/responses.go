package classify

import (
	"bytes"
	"net/http"
	"time"

	"github.com/llmgate/llmgate/classify/jsonscan"
)

// The Responses API (/v1/responses) answers with a response object, not a
// completion: its "status" says how it ended, "output" holds typed items
// (messages with output_text or refusal parts, function_call and the other
// *_call tool items, reasoning), and a stream is a sequence of typed
// events that ends with response.completed, response.incomplete or
// response.failed, each carrying the whole response object.

// responseStatus is what a response object's "status" says.
type responseStatus uint8

const (
	statusOther      responseStatus = iota // absent, or one this package does not judge
	statusCompleted                        // "completed"
	statusIncomplete                       // "incomplete"
	statusFailed                           // "failed"
	statusPending                          // "queued" or "in_progress": a background response's creation answer
)

// responseSummary is what one response object shows.
type responseSummary struct {
	status    responseStatus
	filtered  bool   // incomplete_details.reason content_filter
	maxTokens bool   // incomplete_details.reason max_output_tokens
	generated bool   // some output text, refusal or tool call
	errObject []byte // the raw "error" value, when it is an object
	usage     Tokens
}

var (
	responseKeys   = jsonscan.NewExactKeys("status", "incomplete_details", "output", "error", "usage")
	incompleteKeys = jsonscan.NewExactKeys("reason")
	itemKeys       = jsonscan.NewExactKeys("type", "content")
	partKeys       = jsonscan.NewExactKeys("text", "refusal")
)

// walkResponse reads the response object the scanner is at into sum.
func walkResponse(s *jsonscan.Scanner, sum *responseSummary) {
	for key := range s.Fields(responseKeys) {
		switch key {
		case "status":
			sum.status = statusOf(s.Value())
		case "incomplete_details":
			for range s.Fields(incompleteKeys) {
				v := s.Value()
				sum.filtered = jsonscan.Equal(v, "content_filter") || sum.filtered
				sum.maxTokens = jsonscan.Equal(v, "max_output_tokens") || sum.maxTokens
			}
		case "output":
			for range s.Elements() {
				sum.generated = walkItem(s) || sum.generated
			}
		case "error":
			if s.Peek() == '{' {
				sum.errObject = s.Value()
			}
		case "usage":
			sum.usage = readUsage(s)
		}
	}
}

func statusOf(v []byte) responseStatus {
	switch {
	case jsonscan.Equal(v, "completed"):
		return statusCompleted
	case jsonscan.Equal(v, "incomplete"):
		return statusIncomplete
	case jsonscan.Equal(v, "failed"):
		return statusFailed
	case jsonscan.Equal(v, "queued"), jsonscan.Equal(v, "in_progress"):
		return statusPending
	}
	return statusOther
}

// walkItem reads one output item and reports whether it is output: a tool
// call of any kind (function_call, web_search_call, ...: its type ends in
// "_call"), or a message with a non-empty text or refusal part. A
// reasoning item is not output: a model that only thought answered
// nothing.
func walkItem(s *jsonscan.Scanner) bool {
	var message, call, text bool
	for key := range s.Fields(itemKeys) {
		switch key {
		case "type":
			v := s.Value()
			message = jsonscan.Equal(v, "message")
			call = isCallType(v)
		case "content":
			for range s.Elements() {
				for range s.Fields(partKeys) {
					text = nonEmpty(s.Value()) || text
				}
			}
		}
	}
	return call || (message && text)
}

// isCallType reports whether a raw "type" token names a tool call item.
func isCallType(v []byte) bool {
	if bytes.IndexByte(v, '\\') >= 0 {
		v = []byte(`"` + jsonscan.Unquote(v) + `"`) // escaped: rare, allocate
	}
	return len(v) > len(`"_call"`) && v[0] == '"' && bytes.HasSuffix(v, []byte(`_call"`))
}

// outcome decides what a response object came to.
//
//   - status failed: classified by its error object like an error inside
//     a stream (error.code server_error → ServerError, rate_limit_exceeded →
//     RateLimited, ...); without one, ServerError "status failed".
//   - incomplete with incomplete_details.reason content_filter:
//     ContentFilter.
//   - incomplete with reason max_output_tokens: Success, Note
//     "max_output_tokens" (the model's answer, cut where the client said).
//   - queued or in_progress (background: true): Success, the creation
//     answer.
//   - no output text, refusal or tool call: Empty.
//   - else Success.
func (sum *responseSummary) outcome() Outcome {
	switch {
	case sum.status == statusFailed && sum.errObject != nil:
		return fromErrorBody(0, parseErrorBody(sum.errObject))
	case sum.status == statusFailed:
		return Outcome{Class: ServerError, Reason: "status failed"}
	case sum.status == statusIncomplete && sum.filtered:
		return Outcome{Class: ContentFilter, Reason: "incomplete_details.reason content_filter"}
	case sum.status == statusIncomplete && sum.maxTokens:
		return Outcome{Class: Success, Reason: "incomplete_details.reason max_output_tokens", Note: NoteMaxOutputTokens}
	case sum.status == statusPending:
		return Outcome{Class: Success, Reason: "background response"}
	case !sum.generated:
		return Outcome{Class: Empty, Reason: "empty output"}
	}
	return Outcome{Class: Success, Reason: "output"}
}

// NoteMaxOutputTokens is the Note of a response cut at max_output_tokens.
const NoteMaxOutputTokens = "max_output_tokens"

// FromResponses classifies the 2xx JSON body of POST /v1/responses; h and
// now are the response's headers and when they arrived, for the wait a
// rate-limited failure asks for.
//
//   - not a JSON object, or truncated: Transient "malformed response body".
//   - an error object and no status (a 200 that is an error): classified
//     like FromResponse with status 0.
//   - else by its status, incomplete_details and output (see POLICY.md):
//     failed → by error.code; incomplete with content_filter →
//     ContentFilter; incomplete with max_output_tokens → Success with Note
//     max_output_tokens; queued/in_progress (background) → Success; no
//     output text, refusal or tool call → Empty; else Success.
//
// A retryable failure carries the Retry-After of h (x-ratelimit-reset-*
// only when rate limited, as for a 429). Its Usage is the body's
// usage.input_tokens / output_tokens.
func FromResponses(body []byte, h http.Header, now time.Time) Outcome {
	s := jsonscan.New(body, 0)
	if s.Peek() != '{' {
		return Outcome{Class: Transient, Reason: "malformed response body"}
	}
	var sum responseSummary
	walkResponse(s, &sum)
	if s.Err() != nil || !s.AtEnd() {
		return Outcome{Class: Transient, Reason: "malformed response body"}
	}
	var o Outcome
	if sum.status == statusOther && sum.errObject != nil {
		o = fromErrorBody(0, parseErrorBody(sum.errObject))
	} else {
		o = sum.outcome()
	}
	if o.Class.Retryable() {
		o.RetryAfter, o.HasRetryAfter = parseRetryAfter(h, now, o.Class == RateLimited)
	}
	o.Usage = sum.usage
	return o
}
