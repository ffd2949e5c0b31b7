package config

import (
	"net/http"
	"path"
	"strings"
)

// Passthrough calls that spend unmetered: the provider bills them, but
// the gateway cannot charge them to a budget when they run — a batch's
// usage arrives hours later in its output file, an image's or a speech
// clip's never as tokens the gateway reads. A budgeted client's such call
// is refused (403 budget_unmetered_endpoint) unless the operator allows
// it (Budgets.AllowUnmetered, Client.AllowUnmetered).

// unmeteredFree are the passthrough families whose POSTs make the
// provider run no model: storage and bookkeeping, billed (if at all) by
// the byte-day, not by the call.
var unmeteredFree = []string{
	"/v1/moderations",   // free at OpenAI
	"/v1/files",         // uploads (OpenAI's and Anthropic's Files API)
	"/v1/uploads",       // multipart uploads, their parts, complete, cancel
	"/v1/vector_stores", // stores, their files and searches: storage
	"/v1/conversations", // conversations and their items: storage
}

// unmeteredCancels are the POSTs that stop spending rather than start
// it: one path segment (the object's id) where the * is.
var unmeteredCancels = []string{
	"/v1/batches/*/cancel",
	"/v1/messages/batches/*/cancel",
	"/v1/responses/*/cancel",
}

// SpendsUnmetered reports whether a passthrough request (a path under
// PassthroughPrefixes or /v1/messages/batches, clean) makes the provider
// spend in a way no budget can charge as it runs: a POST that is not
// storage nor a cancel — images, audio, OpenAI batches, Anthropic
// message batches. GET, DELETE and the rest only read or remove. A POST
// under a family not listed as free counts as spending, so a
// passthrough family added later is refused to budgeted clients until it
// is listed here.
func SpendsUnmetered(method, p string) bool {
	if method != http.MethodPost {
		return false
	}
	for _, pre := range unmeteredFree {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return false
		}
	}
	for _, pat := range unmeteredCancels {
		if ok, _ := path.Match(pat, p); ok {
			return false
		}
	}
	return true
}

// UnmeteredAllowed reports whether c's passthrough calls that spend
// unmetered run when c has a budget: c.AllowUnmetered when set, else
// global (budgets.allow_unmetered).
func (c Client) UnmeteredAllowed(global bool) bool {
	if c.AllowUnmetered != nil {
		return *c.AllowUnmetered
	}
	return global
}
