package request

import (
	"github.com/llmgate/llmgate/gateway/proxy"
)

// countUsage counts the tokens an upstream's answer reported, or that it
// reported none. It is called once per answer, where the request path
// settles it (serveUnkeyed, keyedCall.json and keyedCall.stream, right
// after Settle), so a keyed call that runs on after its client left is
// counted too. Replays are counted apart, as tokens saved, by the
// idempotency Keeper.
//
// Only a 2xx answer counts: any other status says nothing of what was
// used. The usage comes from the walk that classified the answer (a
// completion body, every stream event); an embeddings body, which nothing
// classifies, is scanned once for it here. A body too large to buffer was
// never read whole, and counts as usage missing.
func (g *Handler) countUsage(endpoint string, cl *proxy.Call, resp *proxy.Response) {
	if resp.Status < 200 || resp.Status > 299 || cl.Passthrough {
		return
	}
	g.metrics.Usage(resp.Upstream.Cfg.Name, endpoint, cl.Model, ClientOf(cl.In), cl.Usage(resp))
}
