package request

import (
	"context"
	"encoding/hex"
	"net/http"

	"github.com/llmgate/llmgate/gateway/apierror"
)

// Chained gateways. An llmgate in front of another is one client of the
// inner one, which would otherwise keep every outer tenant's answers in
// one scope: its content cache would hand one outer tenant another's
// completion, which tells the second whether the first sent a prompt. So
// every request a gateway sends upstream carries TenantHeader, an opaque
// id of the tenant it serves (see forwardTenant), and a gateway that
// receives one narrows the client's content-cache scope to (authenticated
// client, forwarded id). The header can only narrow: the scope still
// starts with the client its key authenticated, so no value reaches
// another client's entries. The client's limits (rate, concurrency,
// stored bytes), its dead-letter bound and its purge stay the
// authenticated client's — narrowing them would widen what one key may
// take, one forwarded id at a time. Idempotency keys are kept apart
// already: the outer gateway forwards a key derived from its tenant
// (idempotency.ForwardKey).

// TenantHeader carries the opaque id of the tenant a request is sent for.
const TenantHeader = "X-Llmgate-Tenant"

// maxTenantLen bounds a forwarded tenant id: forwardTenant's are 32.
const maxTenantLen = 64

type tenantCtxKey struct{}

// forwardedTenant is the tenant id the request came with ("" for none).
func forwardedTenant(r *http.Request) string {
	s, _ := r.Context().Value(tenantCtxKey{}).(string)
	return s
}

// readTenant reads TenantHeader: at most one, 1–64 characters of
// [A-Za-z0-9_-]. Anything else is refused (400), as an ambiguous
// credential is.
func readTenant(h http.Header) (string, error) {
	vs := h.Values(TenantHeader)
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", apierror.InvalidCode("invalid_tenant", "", "Send at most one "+TenantHeader+" header.", nil)
	}
	v := vs[0]
	ok := len(v) > 0 && len(v) <= maxTenantLen
	for i := 0; ok && i < len(v); i++ {
		c := v[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
	}
	if !ok {
		return "", apierror.InvalidCode("invalid_tenant", "", TenantHeader+" must be 1–64 characters of A–Z, a–z, 0–9, '-' and '_'.", nil)
	}
	return v, nil
}

// WithTenant is r with its forwarded tenant id (readTenant) in its
// context; the gateway's authentication calls it after WithClient.
func WithTenant(r *http.Request) (*http.Request, error) {
	t, err := readTenant(r.Header)
	if err != nil || t == "" {
		return r, err
	}
	return r.WithContext(context.WithValue(r.Context(), tenantCtxKey{}, t)), nil
}

// forwardTenant is the TenantHeader value sent upstream for r: an HMAC
// (idempotency.forward_key_secret) of its client and the tenant id it came
// with, so that the upstream cannot tell a client's name, and a chain of
// gateways keeps narrowing. "" when there is nobody to tell apart (no
// clients, no forwarded id).
func (g *Handler) forwardTenant(r *http.Request) string {
	client, fwd := ClientOf(r), forwardedTenant(r)
	if client == "" && fwd == "" {
		return ""
	}
	var sum [32]byte
	return hex.EncodeToString(g.forwardMAC.Sum(sum[:0], "tenant", client, fwd)[:16])
}

// contentCacheID is the record id of a content-keyed cache entry for a
// body of fingerprint fp, within the client's scope: narrowed to the
// forwarded tenant, when r came with one.
func contentCacheID(r *http.Request, fp string) string {
	if t := forwardedTenant(r); t != "" {
		return "cache:" + t + ":" + fp
	}
	return "cache:" + fp
}
