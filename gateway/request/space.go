package request

import (
	"fmt"
	"time"

	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

// StoreFullRetryAfter is the Retry-After of a 503 idempotency_store_full:
// room comes back from an operator or from expiry and compaction, which
// take longer than a second, and clients should not hammer a full store.
const StoreFullRetryAfter = 30 * time.Second

// spaceCheck refuses a keyed request that would store while the store is
// full. A content-cached request is served without being stored instead
// (caching saves calls; it is no guarantee a client asked for).
// The request's log class is gateway_error, as for a store that fails.
func (g *Handler) spaceCheck(kr *idempotency.Request) error {
	if kr.NoStore {
		return nil
	}
	sp, ok := g.space()
	if !ok || !sp.Full {
		return nil
	}
	if kr.Cache {
		kr.NoStore = true
		return nil
	}
	return &apierror.StoreFull{Reason: sp.Reason, RetryAfter: StoreFullRetryAfter,
		Err: fmt.Errorf("%s: %d bytes free (floor %d), %d bytes live (cap %d)", sp.Reason, sp.FreeBytes, sp.MinFreeBytes, sp.LiveBytes, sp.MaxBytes)}
}
