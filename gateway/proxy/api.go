package proxy

import (
	"net/http"
	"time"

	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/ownership"
	"github.com/llmgate/llmgate/gateway/sse"
)

// API is one provider API as the request path sees it: how its 2xx
// answers are classified, where their token usage is, how its streams are
// framed and where their held tail starts, and the error event its SDKs
// raise on. An endpoint names its API once (gateway's endpoint table);
// the proxy decides from the value, never from the path, so another
// provider API is another value, not a branch through this package.
type API struct {
	// Name is the API's name in logs and traces ("openai.chat").
	Name string
	// provider is the upstreams' api (config.APIOpenAI,
	// config.APIAnthropic): an endpoint of this API routes only to them.
	provider string
	// classify classifies a whole 2xx body; nil: any 2xx is a success.
	classify func(body []byte, h http.Header, now time.Time) classify.Outcome
	// usage reads the token usage of a 2xx body that classify does not
	// walk (embeddings); nil: the outcome's.
	usage func(body []byte) classify.Tokens
	// unbilled: the provider bills nothing for a call of this API (a
	// token count), so budgets neither reserve nor charge for it.
	unbilled bool
	// stream is how its SSE streams are framed.
	stream framing
	// errorBody renders an error the gateway itself makes in the shape
	// the API's SDKs parse (apierror.Body, apierror.AnthropicBody).
	errorBody func(*apierror.Error) []byte
	// fingerprinted are the request headers (canonical names) that change
	// the answer as much as the body does: an idempotency key's
	// fingerprint covers them. None for OpenAI's APIs.
	fingerprinted []string
	// objects is how its bodies name and hand out provider objects, for
	// the ownership check under a key clients share.
	objects ownership.Scheme
}

// framing is how an API's streams are read.
type framing struct {
	// observer picks the relay's observer: where the stream's tail starts
	// and when it has ended.
	observer observerKind
	// preamble reports an announcing event (response.created,
	// message_start) that is held back with the one after it, so a
	// failure right after it is still retried: the held start is observed
	// as the stream would be, and when it ends in a retryable failure (an
	// error event) the attempt fails before the client saw a byte. nil:
	// no event is held, and the first is relayed as it is.
	preamble func(data []byte) bool
	// cutReason is why a stream that stopped before its end is transient.
	cutReason string
	// event is the one error event that ends a stream which broke after
	// its first byte reached the client, in the shape its SDKs raise on.
	event func(msg, code string) []byte
	// recordedUsage reads the usage of a committed stream from its
	// recorded events, for the tokens a replay saves; nil: idempotency
	// reads it as an OpenAI stream's (its tail's usage chunk).
	recordedUsage func(events [][]byte) classify.Tokens
}

type observerKind uint8

const (
	// dataOnly: data-only events ending at [DONE]; the tail starts at the
	// first finish_reason (chatObserver).
	dataOnly observerKind = iota
	// typedResponses: typed events (event: + data:) ending at a terminal
	// event, which is the tail (responsesObserver).
	typedResponses
	// typedMessages: Anthropic's typed events ending at message_stop (or
	// an error event); the tail starts at the message_delta that carries
	// the stop_reason (messagesObserver).
	typedMessages
)

// The OpenAI APIs.
var (
	// Plain answers are not inspected (embeddings, passthrough): any 2xx
	// is a success; usage, where there is any, is read from the body.
	Plain = &API{Name: "openai.plain", provider: config.APIOpenAI, errorBody: apierror.Body, objects: ownership.OpenAIScheme, usage: classify.Usage, stream: chatFraming}
	// ChatCompletions is /v1/chat/completions: a body is classified by
	// classify.FromCompletion; a stream is data-only events ending at
	// [DONE], its tail starting at the first finish_reason.
	ChatCompletions = &API{Name: "openai.chat", provider: config.APIOpenAI, errorBody: apierror.Body, objects: ownership.OpenAIScheme, classify: fromCompletion, stream: chatFraming}
	// Completions is /v1/completions, classified as chat is.
	Completions = &API{Name: "openai.completions", provider: config.APIOpenAI, errorBody: apierror.Body, objects: ownership.OpenAIScheme, classify: fromCompletion, stream: chatFraming}
	// Responses is /v1/responses: a body is classified by
	// classify.FromResponses; a stream is typed events that end at a
	// terminal event (response.completed, response.incomplete,
	// response.failed), which is its tail.
	Responses = &API{Name: "openai.responses", provider: config.APIOpenAI, errorBody: apierror.Body, objects: ownership.OpenAIScheme, classify: classify.FromResponses, stream: framing{
		observer:  typedResponses,
		preamble:  classify.ResponsesPreamble,
		cutReason: "stream ended without a terminal event",
		event:     apierror.TypedStreamEvent,
	}}
)

// The Anthropic APIs.
var (
	// Messages is Anthropic's /v1/messages: a body is classified by
	// classify.FromMessages; a stream is typed events that end at
	// message_stop, its tail starting at the message_delta that carries
	// the stop_reason. Its start (message_start, ping, content_block_start:
	// nothing a client shows yet) is held with the event after it, so a
	// message_start followed by an overloaded_error event is retried. A
	// broken stream ends with Anthropic's error event, which its SDKs
	// raise on.
	Messages = &API{Name: "anthropic.messages", provider: config.APIAnthropic, errorBody: apierror.AnthropicBody, objects: ownership.AnthropicScheme, fingerprinted: anthropicHeaders, classify: classify.FromMessages, stream: messagesFraming}
	// CountTokens is Anthropic's /v1/messages/count_tokens: any 2xx is a
	// success, and its input_tokens are a count, not tokens used.
	// Counting costs nothing at the provider: no budget is reserved or
	// charged for it (unbilled).
	CountTokens = &API{Name: "anthropic.count_tokens", provider: config.APIAnthropic, errorBody: apierror.AnthropicBody, objects: ownership.AnthropicScheme, fingerprinted: anthropicHeaders, usage: noUsage, stream: messagesFraming, unbilled: true}
	// MessageBatches is Anthropic's Message Batches API under
	// /v1/messages/batches, a passthrough: any 2xx is a success, and no
	// answer carries token usage (a batch's results are its own). Its ids
	// are recorded and checked as the OpenAI objects are; each request's
	// params as a Messages body (AnthropicBatchScheme).
	MessageBatches = &API{Name: "anthropic.message_batches", provider: config.APIAnthropic, errorBody: apierror.AnthropicBody, objects: ownership.AnthropicBatchScheme, fingerprinted: anthropicHeaders, usage: noUsage, stream: messagesFraming}
)

// AnthropicPlain is the rest of Anthropic's surface the gateway relays
// (GET /v1/models and the Files API, chosen by the anthropic-version
// header): any 2xx is a success, and no usage is counted.
var AnthropicPlain = &API{Name: "anthropic.plain", provider: config.APIAnthropic, errorBody: apierror.AnthropicBody,
	objects: ownership.AnthropicScheme, fingerprinted: anthropicHeaders, usage: noUsage, stream: messagesFraming}

// anthropicHeaders choose the answer's version and beta features.
var anthropicHeaders = []string{"Anthropic-Version", "Anthropic-Beta"}

var messagesFraming = framing{
	observer:  typedMessages,
	preamble:  classify.MessagesPreamble,
	cutReason: "stream ended without message_stop",
	event:     apierror.AnthropicStreamEvent,
	// message_start has the input counts, the last message_delta the
	// output's: the stream is read whole, as the relay read it.
	recordedUsage: func(events [][]byte) classify.Tokens {
		var o classify.MessagesObserver
		for _, ev := range events {
			o.Observe(sse.Data(ev))
		}
		return o.Usage()
	},
}

func noUsage([]byte) classify.Tokens { return classify.Tokens{} }

// Billed reports whether the provider bills a call of this API.
func (a *API) Billed() bool { return !a.unbilled }

// Provider is the upstreams' API this one speaks: config.APIOpenAI or
// config.APIAnthropic.
func (a *API) Provider() string { return a.provider }

var chatFraming = framing{observer: dataOnly, cutReason: "stream ended without [DONE]", event: apierror.StreamEvent}

func fromCompletion(body []byte, _ http.Header, _ time.Time) classify.Outcome {
	return classify.FromCompletion(body)
}

// StreamEvent is the one error event that ends a stream of this API which
// broke after its first byte reached the client, in the shape its SDKs
// raise on.
func (a *API) StreamEvent(msg, code string) []byte { return a.stream.event(msg, code) }

// RecordedUsage reads the usage of a committed stream of this API from
// its recorded events; nil where idempotency's own reading (OpenAI's)
// applies.
func (a *API) RecordedUsage() func(events [][]byte) classify.Tokens { return a.stream.recordedUsage }

// Objects is how the API's bodies name and hand out provider objects.
func (a *API) Objects() ownership.Scheme { return a.objects }

// Fingerprinted are the request headers an idempotency key's fingerprint
// covers besides the body (canonical names).
func (a *API) Fingerprinted() []string { return a.fingerprinted }

// ErrorBody is e, an error the gateway itself makes, in the shape this
// API's SDKs parse.
func (a *API) ErrorBody(e *apierror.Error) []byte { return a.errorBody(e) }

// WriteError maps err (apierror.Wire) and writes it to w in this API's
// shape, with the same status, Retry-After and x-should-retry whatever
// the API.
func (a *API) WriteError(w http.ResponseWriter, err error) *apierror.Error {
	e := apierror.Wire(err)
	apierror.SetHeader(w.Header(), e)
	w.WriteHeader(e.Status)
	_, _ = w.Write(a.errorBody(e))
	return e
}

// Classify classifies a whole 2xx body of this API.
func (a *API) Classify(body []byte, h http.Header, now time.Time) classify.Outcome {
	if a.classify == nil {
		return classify.Outcome{Class: classify.Success}
	}
	return a.classify(body, h, now)
}

// Usage is the token usage of a whole 2xx answer whose outcome is o.
func (a *API) Usage(body []byte, o classify.Outcome) classify.Tokens {
	if a.usage != nil {
		return a.usage(body)
	}
	return o.Usage
}

// observer is what the relay asks of a stream's observer.
type observer interface {
	Observe(data []byte)
	// tailStarted: from this event on, the stream is ending; a keyed
	// stream holds it back until the commit is durable.
	tailStarted() bool
	// Ended: the stream's last event arrived.
	Ended() bool
	// SawError: the upstream told the client the stream failed.
	SawError() bool
	Outcome() classify.Outcome
}

// chatObserver: a chat stream's tail starts at the first finish_reason
// (SDKs take a stream that stops after one as complete), or at [DONE].
type chatObserver struct{ classify.StreamObserver }

func (o *chatObserver) tailStarted() bool { return o.Finished() || o.SawDone() }

// responsesObserver: a Responses stream's tail is its clean terminal
// event (completed or incomplete). response.failed is not held: it is the
// upstream's own failure event, relayed as it is.
type responsesObserver struct{ classify.ResponsesObserver }

func (o *responsesObserver) tailStarted() bool { return o.Finished() }

// messagesObserver: a Messages stream's tail starts at the message_delta
// that carries the stop_reason (or message_stop, when none did). An error
// event is not held: it is the upstream's own failure event, relayed as
// it is.
type messagesObserver struct{ classify.MessagesObserver }

func (o *messagesObserver) tailStarted() bool { return o.Finished() }

// observers holds one observer of each kind, so that choosing one
// allocates nothing beyond its holder.
type observers struct {
	chat      chatObserver
	responses responsesObserver
	messages  messagesObserver
}

// of is the observer of kind k.
func (o *observers) of(k observerKind) observer {
	switch k {
	case typedResponses:
		return &o.responses
	case typedMessages:
		return &o.messages
	}
	return &o.chat
}

// maxPreamble bounds the announcing events (response.created,
// message_start, ...) a stream's start holds back.
const maxPreamble = 8
