package request

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

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
func (g *Handler) sharedKey(client string, u *proxy.Upstream) bool {
	if !g.tenants {
		return false
	}
	_, own := g.apiKeys[client][u.Cfg.Name]
	return !own
}

// sharedView is what a request would show a provider under a key clients
// share: the objects it names (in its path or JSON body), or why it must
// not go under such a key at all.
type sharedView struct {
	path string
	// body is the JSON scanned for object ids (nil for none).
	body []byte
	// refused, when set, is why the request cannot go under a shared key:
	// a list of every tenant's objects, or a body that cannot be scanned.
	refused error
	// storeFalse, when set, is the body a force_store_false upstream gets.
	storeFalse []byte
}

// plan sets cl.Hops: the upstreams of u's chain the request may reach,
// each under the credential the client reaches it with. A hop under the
// client's own key (or, with one tenant, the upstream's) goes as it is;
// a hop under a shared key only when the objects the request names were
// checked to be the client's on that upstream. When the routed upstream
// itself is shared and the request names objects, the plan is the one
// hop to the upstream that holds them (whatever the model routes to); a
// fallback under a shared key that does not hold them is left out, never
// sent. When the routed upstream is the client's own but the objects the
// request names were created through a fallback under a shared key (and
// recorded there), the plan is likewise the one hop to that fallback.
func (g *Handler) plan(r *http.Request, cl *proxy.Call, u *proxy.Upstream, view sharedView) error {
	client := ClientOf(r)
	cl.Client = client
	chain := u.Chain()
	if !slices.ContainsFunc(chain, func(cu *proxy.Upstream) bool { return g.sharedKey(client, cu) }) {
		cl.Hops = make([]proxy.Hop, 0, len(chain))
		for _, cu := range chain {
			cl.Hops = append(cl.Hops, g.privateHop(client, cu, view))
		}
		return nil
	}
	checked, refs, err := g.verify(r, callAPI(cl), view)
	if g.sharedKey(client, u) {
		if err != nil {
			return err
		}
		if holder, named := checked.Holder(); named {
			hu := g.router.Upstream(holder)
			if hu == nil || !hu.Speaks(callAPI(cl)) {
				// Its upstream is no longer configured, or speaks another
				// API than the request (an OpenAI file named in a Messages
				// body, or on Anthropic's Files API): the object is out of
				// reach here.
				return ownership.NotFound(refs[0])
			}
			hop, _ := proxy.SharedHop(hu, checked)
			cl.Hops = []proxy.Hop{withStoreFalse(hop, view)}
			return nil
		}
	}
	if hop, ok := g.sharedHolderHop(client, chain, checked, view); ok {
		cl.Hops = []proxy.Hop{hop}
		return nil
	}
	cl.Hops = make([]proxy.Hop, 0, len(chain))
	for _, cu := range chain {
		if !g.sharedKey(client, cu) {
			cl.Hops = append(cl.Hops, g.privateHop(client, cu, view))
			continue
		}
		hop, ok := proxy.SharedHop(cu, checked)
		if !ok {
			g.log.Debug("fallback left out of the plan: under the shared key the request's objects are not the client's there",
				"upstream", cu.Cfg.Name, "err", err)
			continue
		}
		cl.Hops = append(cl.Hops, withStoreFalse(hop, view))
	}
	return nil
}

// createCheck refuses an unkeyed request that creates provider objects
// under a shared key — a POST to a collection (/v1/files, /v1/batches,
// /v1/vector_stores, /v1/conversations, /v1/uploads, /v1/messages/batches)
// or a stored response, on its first hop — while the store is full (503
// ownership_store_full) or the client's stored bytes are over its quota
// (429): each object's ownership entry is kept in the store and counts
// against both. A keyed request is checked on the keyed path, after its
// lookup, so that a committed answer is still replayed. Calls on an
// object the client has (a cancel, a search, an upload's parts), a
// response with store false and a Messages call are not refused (a
// container a message hands out is recorded and counted all the same).
func (g *Handler) createCheck(r *http.Request, cl *proxy.Call, body []byte, s *summary) error {
	if r.Method != http.MethodPost || !ownership.Creates(r.URL.Path) || !cl.Hops[0].Shared() {
		return nil
	}
	if _, named := ownership.FromPath(r.URL.Path); named {
		return nil
	}
	if cl.Suffix == "/responses" && (cl.Hops[0].Upstream.Cfg.ForceStoreFalse || !ownership.Stored(body)) {
		return nil
	}
	if sp, ok := g.space(); ok && sp.Full {
		s.class = "gateway_error"
		return &apierror.Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "ownership_store_full",
			Message: "The gateway's store is full, so this request was not sent: the objects it creates could not be recorded as yours. " +
				"Retry after the Retry-After interval.",
			RetryAfter: StoreFullRetryAfter, Err: fmt.Errorf("store full (%s): %d bytes live (cap %d)", sp.Reason, sp.LiveBytes, sp.MaxBytes)}
	}
	if err := g.limits.CheckStorage(cl.Client); err != nil {
		s.class = "client_limited"
		return err
	}
	return nil
}

// sharedHolderHop is the hop to the upstream of chain that holds the
// objects checked names, when the client reaches it under a shared key:
// a create that fell back from the client's own key to it left them
// there, and only there. The routed upstream (the client's own key)
// would answer 404, which is no reason to retry or fall back, and the
// holder would never be tried.
func (g *Handler) sharedHolderHop(client string, chain []*proxy.Upstream, checked ownership.Checked, view sharedView) (proxy.Hop, bool) {
	holder, named := checked.Holder()
	if !named {
		return proxy.Hop{}, false
	}
	for _, cu := range chain {
		if cu.Cfg.Name == holder && g.sharedKey(client, cu) {
			if hop, ok := proxy.SharedHop(cu, checked); ok {
				return withStoreFalse(hop, view), true
			}
		}
	}
	return proxy.Hop{}, false
}

// callAPI is the API cl's endpoint speaks (Plain when it names none).
func callAPI(cl *proxy.Call) *proxy.API {
	if cl.API == nil {
		return proxy.Plain
	}
	return cl.API
}

// verify checks the objects view names, its body read as api's, against
// the client's records. A refused view, or an object that is not the
// client's, is an error and a zero Checked (it allows nothing).
func (g *Handler) verify(r *http.Request, api *proxy.API, view sharedView) (ownership.Checked, []ownership.Ref, error) {
	if view.refused != nil {
		return ownership.Checked{}, nil, view.refused
	}
	var refs []ownership.Ref
	if ref, ok := ownership.FromPath(view.path); ok {
		refs = append(refs, ref)
	}
	refs = append(refs, api.Objects().Names(view.body)...)
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.Store.OpTimeout.D())
	defer cancel()
	checked, err := g.owners.Verify(ctx, ClientOf(r), refs)
	return checked, refs, err
}

// privateHop is the hop to u under the key only client uses there: its
// own, or u's when the gateway has one tenant.
func (g *Handler) privateHop(client string, u *proxy.Upstream, view sharedView) proxy.Hop {
	key, ok := g.apiKeys[client][u.Cfg.Name]
	if !ok {
		key = u.Cfg.APIKey
	}
	return withStoreFalse(proxy.PrivateHop(u, key), view)
}

// withStoreFalse gives a force_store_false upstream's hop the body with
// "store" forced to false.
func withStoreFalse(h proxy.Hop, view sharedView) proxy.Hop {
	if view.storeFalse != nil && h.Upstream.Cfg.ForceStoreFalse {
		return h.WithBody(view.storeFalse)
	}
	return h
}

// passView is a passthrough request's sharedView (see listAllowed,
// passBodyJSON).
func (g *Handler) passView(r *http.Request, pb passBody) sharedView {
	view := sharedView{path: r.URL.Path}
	if ownership.TenantList(r.Method, r.URL.Path) {
		view.refused = ownership.ListRefused(strings.TrimSuffix(r.URL.Path, "/"))
		return view
	}
	view.body, view.refused = g.passBodyJSON(r.URL.Path, pb)
	return view
}

// passBodyJSON is the JSON the ownership check scans in a passthrough
// body. Under a shared key, a body that was not read as JSON — sent with
// another Content-Type, or none, or streamed unread past
// passthrough.spool_max_bytes — must not go upstream unchecked, since the
// upstream may read it as JSON whatever its Content-Type says: held in
// memory and valid JSON, it is scanned; else it is refused (415, or 413
// when streamed unread). A multipart body is passed on the upload paths
// only (ownership.UploadPath). Of its form fields only those named for a
// file id (images[][file_id], mask[file_id]) name stored objects: they are
// scanned as a JSON body's file_ids would be; the rest (file, purpose,
// model, prompt, ...) are not.
func (g *Handler) passBodyJSON(path string, pb passBody) ([]byte, error) {
	if pb.json != nil {
		return pb.json, nil
	}
	switch {
	case pb.mediaType == "multipart/form-data" && ownership.UploadPath(path):
		if len(pb.fileIDs) == 0 {
			return nil, nil
		}
		return json.Marshal(map[string][]string{"file_ids": pb.fileIDs})
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
// not be sent (its ids would be refused to their owner). What is read,
// and on which paths, is the call's API's (proxy.API.Objects): OpenAI's
// paths that create objects, Anthropic's messages and files.
func (g *Handler) recordObjects(ctx context.Context, client string, cl *proxy.Call, resp *proxy.Response) error {
	if resp.Status < 200 || resp.Status > 299 || !resp.Hop.Shared() {
		return nil
	}
	unstored := cl.Suffix == "/responses" && (resp.Upstream.Cfg.ForceStoreFalse || !ownership.Stored(cl.Body))
	objects, path := callAPI(cl).Objects(), cl.In.URL.Path
	var refs []ownership.Ref
	if resp.Stream != nil {
		for _, ev := range resp.Stream.First() {
			refs = append(refs, objects.Event(path, ev)...)
		}
	} else {
		refs = objects.Answer(path, resp.Body)
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
	// An entry is counted against the quota where it is made, by a POST;
	// a GET that hands out an object again (a batch's output file, at
	// each poll) rewrites the one entry.
	var stored func(string, int64, time.Duration)
	if cl.In.Method == http.MethodPost {
		stored = g.limits.Committed
	}
	return g.owners.Record(ctx, client, resp.Upstream.Cfg.Name, refs, stored)
}

// handOut readies a call's answer to be handed out: recordObjects, then
// a batch answer's results_url pointed at the gateway (pointResults).
// When either fails, the answer is dropped (its breaker learns nothing:
// the upstream did its part) and the error is the client's answer
// instead.
func (g *Handler) handOut(ctx context.Context, client string, cl *proxy.Call, resp *proxy.Response) error {
	err := g.recordObjects(ctx, client, cl, resp)
	if err != nil {
		resp.Report(outcome.Dropped())
		resp.Discard()
		return err
	}
	return g.pointResults(cl, resp)
}

// buffersObjects reports whether a passthrough answer must be buffered
// (up to its record limit) rather than relayed as it arrives, so that the
// ids it hands out can be recorded before the client sees them: an
// answer on a path that creates objects, when a hop of the plan is under
// a shared key. File contents and a message batch's results are not
// objects and stream as they come.
func buffersObjects(r *http.Request, hops []proxy.Hop) bool {
	return ownership.Creates(r.URL.Path) && !strings.HasSuffix(r.URL.Path, "/content") && !strings.HasSuffix(r.URL.Path, "/results") &&
		slices.ContainsFunc(hops, proxy.Hop.Shared)
}

// storeFalseBody is body with "store" forced to false, when the call is a
// POST /responses and some upstream has force_store_false (the attempt
// picks it for such an upstream only); else nil.
func (g *Handler) storeFalseBody(suffix string, body []byte) []byte {
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
