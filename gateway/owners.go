package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/ownership"
	"github.com/llmgate/llmgate/gateway/proxy"
)

// Tenants and provider objects (see package ownership): a client with its
// own key for an upstream (clients[].upstream_api_keys) is kept apart by
// the provider; clients sharing an upstream's key are kept apart here,
// by recording who created each object and checking every id a request
// names. With no clients configured there is one tenant, and nothing to
// keep apart.

// clientAPIKeys indexes the clients' own upstream keys by client name.
func clientAPIKeys(clients []config.Client) map[string]map[string]string {
	keys := map[string]map[string]string{}
	for _, c := range clients {
		if len(c.UpstreamAPIKeys) > 0 {
			keys[c.Name] = c.UpstreamAPIKeys
		}
	}
	return keys
}

// sharedKey reports whether client reaches u with the key other clients
// use too: ownership is then llmgate's to enforce.
func (g *Gateway) sharedKey(client string, u *proxy.Upstream) bool {
	if len(g.clients) == 0 {
		return false
	}
	_, own := g.apiKeys[client][u.Cfg.Name]
	return !own
}

// checkObjects checks that every object r names — in its path, or in its
// JSON body (nil for none) — is client's, before anything is forwarded, and returns the
// upstream that holds them (u when r names none), which the call then
// keeps to: cl.NoFallback. Under the client's own key for u nothing is
// checked.
func (g *Gateway) checkObjects(r *http.Request, cl *proxy.Call, body []byte, u *proxy.Upstream) (*proxy.Upstream, error) {
	client := clientOf(r)
	if !g.sharedKey(client, u) {
		return u, nil
	}
	var refs []ownership.Ref
	if ref, ok := ownership.FromPath(r.URL.Path); ok {
		refs = append(refs, ref)
	}
	refs = append(refs, ownership.FromBody(body)...)
	if len(refs) == 0 {
		return u, nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.Store.OpTimeout.D())
	defer cancel()
	name, err := g.owners.Check(ctx, client, refs)
	if err != nil {
		return nil, err
	}
	cl.NoFallback = true
	holder := g.router.Upstream(name)
	if holder == nil {
		// Its upstream is no longer configured: the object is out of reach.
		return nil, ownership.NotFound(refs[0])
	}
	return holder, nil
}

// passOwnership runs a passthrough request's tenant checks (see
// listAllowed, passBodyJSON, checkObjects) and returns the upstream the
// call keeps to.
func (g *Gateway) passOwnership(r *http.Request, cl *proxy.Call, pb passBody, u *proxy.Upstream) (*proxy.Upstream, error) {
	if err := g.listAllowed(r, u); err != nil {
		return nil, err
	}
	scan, err := g.passBodyJSON(r, pb, u)
	if err != nil {
		return nil, err
	}
	return g.checkObjects(r, cl, scan, u)
}

// passBodyJSON is the JSON checkObjects scans in a passthrough body. Under
// a shared key, a body that was not read as JSON — sent with another
// Content-Type, or none, or streamed unread past
// passthrough.spool_max_bytes — must not go upstream unchecked, since the
// upstream may read it as JSON whatever its Content-Type says: held in
// memory and valid JSON, it is scanned; else it is refused (415, or 413
// when streamed unread). A multipart body is passed on the upload paths
// only (ownership.UploadPath), whose form fields name no stored objects
// (file, purpose, model, prompt, ...): their values are not scanned.
func (g *Gateway) passBodyJSON(r *http.Request, pb passBody, u *proxy.Upstream) ([]byte, error) {
	if pb.json != nil || !g.sharedKey(clientOf(r), u) {
		return pb.json, nil
	}
	switch {
	case pb.mediaType == "multipart/form-data" && ownership.UploadPath(r.URL.Path):
		return nil, nil
	case pb.once:
		return nil, &apierror.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
			Message: fmt.Sprintf("This body is over passthrough.spool_max_bytes (%d), so it would go upstream unread, and clients of this gateway "+
				"share the upstream's key: the objects it names could not be checked to be yours. Send a smaller body.", g.cfg.Passthrough.SpoolMaxBytes)}
	case pb.src.Size() == 0:
		return nil, nil
	case pb.mem != nil && int64(len(pb.mem)) <= g.cfg.Limits.MaxBodyBytes && json.Valid(pb.mem):
		return pb.mem, nil
	}
	return nil, &apierror.Error{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Code: "unsupported_media_type",
		Message: "Send this body as JSON (Content-Type: application/json): clients of this gateway share the upstream's key, " +
			"and the objects a body names are checked to be yours, which the gateway can do for JSON (and for multipart/form-data uploads) only."}
}

// recordObjects records client as the owner of the objects a successful
// answer hands out — a JSON body's, or a Responses stream's first event's
// — before the answer reaches the client (a response created with store
// false is kept by nobody and not recorded, the containers its code ran
// in are); an error means the answer must
// not be sent (its ids would be refused to their owner). Only the paths
// that create objects are scanned.
func (g *Gateway) recordObjects(ctx context.Context, client string, cl *proxy.Call, resp *proxy.Response) error {
	if resp.Status < 200 || resp.Status > 299 || !ownership.Creates(cl.In.URL.Path) || !g.sharedKey(client, resp.Upstream) {
		return nil
	}
	unstored := cl.Suffix == "/responses" && (resp.Upstream.Cfg.ForceStoreFalse || !ownership.Stored(cl.Body))
	var refs []ownership.Ref
	if resp.Stream != nil {
		for _, ev := range resp.Stream.First() {
			refs = append(refs, ownership.FromStreamEvent(ev)...)
		}
	} else {
		refs = ownership.FromAnswer(resp.Body)
	}
	if named, ok := ownership.FromPath(cl.In.URL.Path); ok {
		// The object a GET or POST .../cancel names is the client's
		// already (checkObjects): not recorded again, so its ttl runs
		// from its creation. What it hands out besides (a batch's output
		// file) is.
		refs = slices.DeleteFunc(refs, func(r ownership.Ref) bool { return r.ID == named.ID })
	}
	if unstored {
		// The provider keeps no such response, nothing to name later; the
		// containers its code ran in it keeps.
		refs = slices.DeleteFunc(refs, func(r ownership.Ref) bool { return r.Kind != ownership.Container })
	}
	if len(refs) == 0 {
		return nil
	}
	// Detached: a keyed call records even after its client left.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.Store.OpTimeout.D())
	defer cancel()
	return g.owners.Record(ctx, client, resp.Upstream.Cfg.Name, refs)
}

// recordOrDrop is recordObjects for a call's answer: when the record
// fails, the answer is dropped (its breaker learns nothing: the upstream
// did its part) and the error is the client's answer instead.
func (g *Gateway) recordOrDrop(ctx context.Context, client string, cl *proxy.Call, resp *proxy.Response) error {
	err := g.recordObjects(ctx, client, cl, resp)
	if err != nil {
		resp.Report(outcome.Verdict{Breaker: breaker.Excluded})
		resp.Discard()
	}
	return err
}

// listAllowed refuses a list that would show every tenant's objects
// (ownership.TenantList) to a client that reaches u with a shared key.
func (g *Gateway) listAllowed(r *http.Request, u *proxy.Upstream) error {
	if ownership.TenantList(r.Method, r.URL.Path) && g.sharedKey(clientOf(r), u) {
		return ownership.ListRefused(strings.TrimSuffix(r.URL.Path, "/"))
	}
	return nil
}

// buffersObjects reports whether a passthrough answer must be buffered
// (up to its record limit) rather than relayed as it arrives, so that the
// ids it hands out can be recorded before the client sees them: an
// answer on a path that creates objects, to a client on a shared key.
// File contents are not objects and stream as they come.
func (g *Gateway) buffersObjects(r *http.Request, u *proxy.Upstream) bool {
	return ownership.Creates(r.URL.Path) && !strings.HasSuffix(r.URL.Path, "/content") && g.sharedKey(clientOf(r), u)
}

// storeFalseBody is body with "store" forced to false, when the call is a
// POST /responses and some upstream has force_store_false (the attempt
// picks it for such an upstream only); else nil.
func (g *Gateway) storeFalseBody(suffix string, body []byte) []byte {
	if suffix != "/responses" {
		return nil
	}
	for _, u := range g.cfg.Upstreams {
		if u.ForceStoreFalse {
			return ownership.StoreFalse(body)
		}
	}
	return nil
}
