package admin

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/budget"
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
		name, err := pathParam(c, "name")
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

// clientView is one client in GET /admin/clients: what it keeps in the
// store that other clients do not share, against its bounds.
type clientView struct {
	Client     string `json:"client"`
	Configured bool   `json:"configured"`
	// DeadLetters and DeadLetterBytes are its dead letters now, and the
	// bound on them (dead_letters.max_per_client, max_bytes_per_client;
	// 0: none); DeadLettersDropped how many of its oldest were deleted
	// to keep it within the bound since this process started.
	DeadLetters        int   `json:"dead_letters"`
	DeadLetterBytes    int64 `json:"dead_letter_bytes"`
	MaxDeadLetters     int   `json:"max_dead_letters"`
	MaxDeadLetterBytes int64 `json:"max_dead_letter_bytes"`
	DeadLettersDropped int64 `json:"dead_letters_dropped"`
	// Budgets are its budgets in their current windows: limit, spent,
	// held by runs in flight, remaining, and when each resets.
	Budgets []budget.Status `json:"budgets,omitempty"`
}

// Budgets are what operators see of the clients' budgets
// (budget.View): one read of the store, shared by /metrics, this API and
// the page for a second.
type Budgets interface {
	Snapshot(ctx context.Context) budget.Snapshot
	Chart(ctx context.Context) (series []budget.Series, failed []string)
}

// Clients is the handler of GET /admin/clients: every configured client,
// and every other name that has dead letters (a client removed from the
// config), with its dead letters against their bound and its budgets.
// Register it behind Auth.
func (a *Admin) Clients(c echo.Context) error {
	views, err := a.clientViews(c.Request().Context(), "")
	if err != nil {
		return err
	}
	out := make([]clientView, 0, len(views))
	for _, v := range views {
		out = append(out, *v)
	}
	slices.SortFunc(out, func(x, y clientView) int { return strings.Compare(x.Client, y.Client) })
	return c.JSON(http.StatusOK, struct {
		Clients []clientView `json:"clients"`
	}{out})
}

// Client is the handler of GET /admin/clients/{name}: one client as GET
// /admin/clients lists it, or 404 client_not_found when it is neither
// configured nor has dead letters. Register it behind Auth.
func (a *Admin) Client(c echo.Context) error {
	name, err := pathParam(c, "name")
	if err != nil || name == "" {
		return apierror.Invalid("name", "Name the client: /admin/clients/<name> (URL-escaped).")
	}
	views, err := a.clientViews(c.Request().Context(), name)
	if err != nil {
		return err
	}
	v := views[name]
	if v == nil {
		return apierror.NotFound("client_not_found", "", "No client is named "+quoteName(name)+": it is not configured and has no dead letters.")
	}
	return c.JSON(http.StatusOK, v)
}

// clientViews are the clients GET /admin/clients lists, by name; only
// the one named only, when only is not "".
func (a *Admin) clientViews(ctx context.Context, only string) (map[string]*clientView, error) {
	all, err := a.store.ListDeadLetters(ctx, cache.DeadLetterFilter{Client: only})
	if err != nil {
		return nil, storeErr(err)
	}
	views := map[string]*clientView{}
	view := func(name string) *clientView {
		if only != "" && name != only {
			return &clientView{} // not listed
		}
		v := views[name]
		if v == nil {
			v = &clientView{Client: name, MaxDeadLetters: a.cfg.DeadLetters.MaxPerClient,
				MaxDeadLetterBytes: a.cfg.DeadLetters.PerClientBytes(a.cfg.Store.MaxBytes)}
			views[name] = v
		}
		return v
	}
	for _, cl := range a.cfg.Clients {
		view(cl.Name).Configured = true
	}
	for _, d := range all {
		v := view(d.Client)
		v.DeadLetters++
		v.DeadLetterBytes += d.Stored
	}
	for name, n := range a.dlq.Dropped() {
		view(name).DeadLettersDropped = n
	}
	if a.budgets == nil {
		return views, nil
	}
	snap := a.budgets.Snapshot(ctx)
	for _, cl := range a.cfg.Clients {
		if v := views[cl.Name]; v != nil {
			if snap.Failed[cl.Name] {
				return nil, storeErr(errBudgetsUnread)
			}
			v.Budgets = snap.Clients[cl.Name]
		}
	}
	return views, nil
}

// errBudgetsUnread is the error of a client whose budgets could not be
// read (budget.View logged why).
var errBudgetsUnread = errors.New("the budget store could not be read")
