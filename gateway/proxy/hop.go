package proxy

import (
	"github.com/llmgate/llmgate/gateway/ownership"
)

// Hop is one upstream of a request's plan, with the credential its
// attempts are sent under and the body variant it gets. Execute walks a
// call's hops in order and sends nothing a hop does not say.
//
// A hop under a key other clients of the gateway share is made only by
// SharedHop, from the ownership check's answer for that very upstream:
// there is no field to set and no flag to forget, so a fallback under a
// shared key that would reach another tenant's objects is not a value the
// plan can hold.
type Hop struct {
	Upstream *Upstream
	// key is the bearer token the attempts carry ("" sends none).
	key string
	// shared: other clients reach Upstream with the same key, so what the
	// answer hands out is recorded as the client's (see package ownership).
	shared bool
	// body, when set, is sent instead of the call's body (a Responses
	// create with "store" forced to false for a force_store_false
	// upstream).
	body []byte
}

// PrivateHop is a hop to u under a key no other client of the gateway
// uses: the client's own (clients[].upstream_api_keys), or u's api_key
// when the gateway has one tenant. The provider keeps such a client's
// objects apart; nothing is checked here.
func PrivateHop(u *Upstream, key string) Hop { return Hop{Upstream: u, key: key} }

// SharedHop is a hop to u under u's api_key, which other clients share.
// It is made only when c says the objects the request names are the
// client's on u (or that it names none); ok is false otherwise, and the
// hop must not be planned.
func SharedHop(u *Upstream, c ownership.Checked) (h Hop, ok bool) {
	if !c.Allows(u.Cfg.Name) {
		return Hop{}, false
	}
	return Hop{Upstream: u, key: u.Cfg.APIKey, shared: true}, true
}

// Shared reports whether the hop's key is one other clients share.
func (h Hop) Shared() bool { return h.shared }

// WithBody is h sending body instead of the call's.
func (h Hop) WithBody(body []byte) Hop {
	h.body = body
	return h
}

// Chain is the upstreams a request routed to u may be sent to, in order:
// u, then its fallbacks. The plan decides which of them become hops.
func (u *Upstream) Chain() []*Upstream {
	return append([]*Upstream{u}, u.fallbacks...)
}
