package classify

import "github.com/llmgate/llmgate/classify/jsonscan"

// Why a scanner and not encoding/json: encoding/json validates the whole
// input with its byte-at-a-time state machine before decoding, and skips
// again every value a custom Unmarshaler receives; on a 1 KiB completion
// that was ~15µs and 11 allocations, on every 2xx answer and every stream
// event. jsonscan is as strict as json.Valid and reads only the few fields
// classification and the usage count need, without allocating. Reading
// fields as it goes also lets parseErrorBody keep what a truncated error
// body said before the cut.
//
// Keys match after unescaping, exactly (jsonscan.NewExactKeys), as an
// exact-case client (OpenAI's SDKs) decodes them; a repeated key is
// read each time it appears (it is not refused: an upstream's answer is
// classified, not judged).

var (
	completionKeys = jsonscan.NewExactKeys("choices", "error", "usage")
	choiceKeys     = jsonscan.NewExactKeys("finish_reason", "text", "message", "delta")
	outputKeys     = jsonscan.NewExactKeys("content", "tool_calls", "function_call", "refusal", "audio")
)

// completionSummary is what a completion body, or one stream event, shows.
type completionSummary struct {
	choices   int
	filtered  bool   // finish_reason content_filter in some choice
	finished  bool   // some choice has a finish_reason (not null)
	generated bool   // some choice has output
	errObject []byte // the raw "error" value, when it is an object
	usage     Tokens // what the "usage" object reports
}

// walkCompletion reads a completion body or stream event into sum. It
// reports false when b is not a single, valid JSON object.
func walkCompletion(b []byte, sum *completionSummary) bool {
	s := jsonscan.New(b, 0)
	if s.Peek() != '{' {
		return false
	}
	for key := range s.Fields(completionKeys) {
		switch key {
		case "choices":
			for range s.Elements() {
				sum.choices++
				for key := range s.Fields(choiceKeys) {
					switch key {
					case "finish_reason":
						v := s.Value()
						sum.filtered = jsonscan.Equal(v, "content_filter") || sum.filtered
						sum.finished = sum.finished || (v != nil && string(v) != "null")
					case "text": // legacy /v1/completions
						sum.generated = nonEmpty(s.Value()) || sum.generated
					case "message", "delta":
						for range s.Fields(outputKeys) { // content, tool_calls, ...
							sum.generated = nonEmpty(s.Value()) || sum.generated
						}
					}
				}
			}
		case "error":
			if s.Peek() == '{' {
				sum.errObject = s.Value()
			}
		case "usage":
			sum.usage = readUsage(s)
		}
	}
	return s.Err() == nil && s.AtEnd()
}
