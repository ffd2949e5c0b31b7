package admin

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/gateway/apierror"
)

// ClientData is what the gateway keeps about one client that can be
// forgotten: its idempotency records and dead letters in the store, and
// what its limits counted of them.
type ClientData interface {
	PurgeClient(ctx context.Context, name string) (cache.Purged, error)
}

// purgeTimeout bounds one purge. It runs detached from the operator's
// request: a purge that is started finishes even if the caller hangs up.
const purgeTimeout = 10 * time.Minute

// PurgeClientData is the handler of DELETE /admin/clients/{name}/data:
// it forgets every idempotency record and dead letter of the named client
// — on the tenant's request, or after removing it from the config, so any
// name is accepted — answers with what it deleted, and logs it at WARN.
// Requests of that client in flight lose their claims: their answers are
// not stored. Register it behind Auth.
func (a *Admin) PurgeClientData(d ClientData) echo.HandlerFunc {
	return func(c echo.Context) error {
		name, err := url.PathUnescape(c.Param("name"))
		if err != nil || name == "" {
			return apierror.Invalid("name", "Name the client: /admin/clients/<name>/data (URL-escaped).")
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), purgeTimeout)
		defer cancel()
		p, err := d.PurgeClient(ctx, name)
		configured := false
		for _, cl := range a.cfg.Clients {
			configured = configured || cl.Name == name
		}
		attrs := []any{slog.String("client", name), slog.Bool("configured", configured),
			slog.Int("records", p.Records), slog.Int("dead_letters", p.DeadLetters)}
		if err != nil {
			a.log.Error("purging client data failed part way", append(attrs, slog.Any("err", err))...)
			return storeErr(err)
		}
		a.log.Warn("client data purged", attrs...)
		a.dlq.Poke()
		return c.JSON(http.StatusOK, struct {
			Client     string `json:"client"`
			Configured bool   `json:"configured"`
			cache.Purged
		}{name, configured, p})
	}
}
