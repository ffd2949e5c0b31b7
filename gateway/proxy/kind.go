package proxy

import (
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/apierror"
)

// Kind is what an endpoint's answers are: how a 2xx body is classified,
// and how its streams end and fail. An endpoint names its kind once; the
// proxy decides from it, never from the path.
type Kind uint8

const (
	// Plain answers are not inspected (embeddings): any 2xx is a success.
	Plain Kind = iota
	// Completion: /v1/chat/completions and /v1/completions. A body is
	// classified by classify.FromCompletion; a stream is data-only events
	// that end at [DONE], its tail starting at the first finish_reason.
	Completion
	// Responses: /v1/responses. A body is classified by
	// classify.FromResponses; a stream is typed events (event: + data:)
	// that end at a terminal event (response.completed,
	// response.incomplete, response.failed), which is its tail.
	Responses
)

// StreamEvent is the one error event that ends a stream of this kind
// which broke after its first byte reached the client, in the shape the
// kind's SDKs raise on.
func (k Kind) StreamEvent(msg, code string) []byte {
	if k == Responses {
		return apierror.TypedStreamEvent(msg, code)
	}
	return apierror.StreamEvent(msg, code)
}

// cutReason is why a stream that stopped before its end is transient.
func (k Kind) cutReason() string {
	if k == Responses {
		return "stream ended without a terminal event"
	}
	return "stream ended without [DONE]"
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

// maxPreamble bounds the announcing events (response.created, ...) a
// Responses stream's start holds back.
const maxPreamble = 8
