package demo

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// storedResponseOp is what a request does to a stored response.
type storedResponseOp int

const (
	getResponse storedResponseOp = iota
	deleteResponse
	cancelResponse
	listInputItems
)

// storedResponseRoute parses /v1/responses/{id}[/cancel|/input_items].
func storedResponseRoute(method, rest string) (storedResponseOp, string, bool) {
	id, sub, _ := strings.Cut(rest, "/")
	if id == "" {
		return 0, "", false
	}
	switch {
	case method == http.MethodGet && sub == "":
		return getResponse, id, true
	case method == http.MethodDelete && sub == "":
		return deleteResponse, id, true
	case method == http.MethodPost && sub == "cancel":
		return cancelResponse, id, true
	case method == http.MethodGet && sub == "input_items":
		return listInputItems, id, true
	}
	return 0, "", false
}

// storedResponse answers a request on the stored response id. A background
// response is queued when created; each GET moves it on: in_progress for
// Options.BackgroundPolls GETs, then done.
func (x *exchange) storedResponse(op storedResponseOp, id string) error {
	s := x.s
	s.mu.Lock()
	sr, ok := s.stored[id]
	var view responseObject
	var items []any
	var cancelErr bool
	if ok {
		switch op {
		case getResponse:
			view = s.advance(sr)
		case deleteResponse:
			delete(s.stored, id)
		case cancelResponse:
			cancelErr = !sr.background
			if !cancelErr {
				if s.backgroundDone(sr) {
					view = sr.final
				} else {
					sr.cancelled = true
					view = sr.final.pending("cancelled")
				}
			}
		case listInputItems:
			items = slices.Clone(sr.input)
		}
	}
	s.mu.Unlock()

	switch {
	case !ok:
		return x.writeError(http.StatusNotFound, apiError{
			Message: fmt.Sprintf("Response with id '%s' not found.", id),
			Type:    "invalid_request_error",
		})
	case cancelErr:
		return x.badRequest("", "Only responses created with background=true can be cancelled.")
	case op == deleteResponse:
		return x.writeJSON(map[string]any{"id": id, "object": "response.deleted", "deleted": true})
	case op == listInputItems:
		return x.inputItemList(items)
	}
	return x.writeJSON(view)
}

// advance counts a GET of sr and returns what it shows. Call with s.mu
// held.
func (s *Server) advance(sr *storedResponse) responseObject {
	switch {
	case !sr.background:
		return sr.final
	case sr.cancelled:
		return sr.final.pending("cancelled")
	}
	sr.polls++
	if s.backgroundDone(sr) {
		return sr.final
	}
	return sr.final.pending("in_progress")
}

// backgroundDone reports whether a background response has been polled
// past Options.BackgroundPolls. Call with s.mu held.
func (s *Server) backgroundDone(sr *storedResponse) bool {
	polls := s.opts.BackgroundPolls
	if polls <= 0 {
		polls = 1
	}
	return sr.polls > polls
}

// inputItemList writes the input items as a list, newest first (OpenAI's
// default order), or oldest first with ?order=asc.
func (x *exchange) inputItemList(items []any) error {
	if x.r.URL.Query().Get("order") != "asc" {
		slices.Reverse(items)
	}
	list := map[string]any{"object": "list", "data": items, "has_more": false, "first_id": nil, "last_id": nil}
	if len(items) > 0 {
		list["first_id"] = itemID(items[0])
		list["last_id"] = itemID(items[len(items)-1])
	}
	return x.writeJSON(list)
}

func itemID(item any) any {
	if m, ok := item.(map[string]any); ok {
		return m["id"]
	}
	return nil
}
