package admin

import (
	"encoding/base64"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

func (a *Admin) apiRoutes(grp *echo.Group) {
	grp.GET("/breakers", a.adminBreakers)
	grp.POST("/breakers/:name/open", a.adminForce(true))
	grp.POST("/breakers/:name/close", a.adminForce(false))
	grp.GET("/idempotency/*", a.adminGetKey)
	grp.DELETE("/idempotency/*", a.adminDeleteKey)
	grp.GET("/stats", a.adminStats)
	grp.GET("/deadletters", a.adminListDeadLetters)
	grp.POST("/deadletters/replay", a.adminReplayGroup)
	grp.GET("/deadletters/:id", a.adminGetDeadLetter)
	grp.DELETE("/deadletters/:id", a.adminDeleteDeadLetter)
	grp.POST("/deadletters/:id/replay", a.adminReplayDeadLetter)
	pprofRoutes(grp)
	grp.RouteNotFound("/*", func(echo.Context) error { return echo.ErrNotFound })
}

// breakersView is this replica's breakers plus, when the store is shared,
// the operator overrides every replica follows: the upstreams forced open
// as a whole, and the models forced open, by upstream.
type breakersView struct {
	Scope                string              `json:"scope"`
	Breakers             []breaker.Status    `json:"breakers"`
	SharedOverrides      map[string]bool     `json:"shared_overrides,omitempty"`
	SharedModelOverrides map[string][]string `json:"shared_model_overrides,omitempty"`
}

func (a *Admin) adminBreakers(c echo.Context) error {
	v := breakersView{Scope: a.cfg.Breaker.Scope, Breakers: a.breakers.Snapshot()}
	if a.shared != nil {
		m, err := a.shared.BreakerOverrides(c.Request().Context())
		if err != nil {
			return storeErr(err)
		}
		v.SharedOverrides, v.SharedModelOverrides = map[string]bool{}, map[string][]string{}
		for f, open := range m {
			k := overrideKey(f)
			switch {
			case k.Model == "":
				v.SharedOverrides[k.Upstream] = open
			case open:
				v.SharedModelOverrides[k.Upstream] = append(v.SharedModelOverrides[k.Upstream], k.Model)
			}
		}
		for _, ms := range v.SharedModelOverrides {
			slices.Sort(ms)
		}
	}
	return c.JSON(http.StatusOK, v)
}

// adminForce is POST /admin/breakers/<upstream>/open (or close): the
// upstream's own breaker, which refuses every model of it, or with
// ?model=<model> that model's.
func (a *Admin) adminForce(open bool) echo.HandlerFunc {
	return func(c echo.Context) error {
		name, err := pathParam(c, "name")
		if err != nil {
			return apierror.Invalid("name", "Name the upstream: /admin/breakers/<upstream>/open (URL-escaped).")
		}
		k := breaker.Key{Upstream: name, Model: c.QueryParam("model")}
		if err := a.setBreakerForced(c.Request().Context(), k, open); err != nil {
			return err
		}
		st, _ := a.breakers.Status(k)
		if st.Name == "" {
			// Closing a model that never had a breaker: nothing to close.
			st = breaker.Status{Name: k.Upstream, Model: k.Model, Covers: "model", State: breaker.Closed}
		}
		return c.JSON(http.StatusOK, st)
	}
}

func quoteName(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return "\"" + s + "\""
}

// recordView is the admin view of an idempotency record: never the body
// unless asked for with ?body=1.
type recordView struct {
	Client      string              `json:"client"`
	Endpoint    string              `json:"endpoint"`
	State       string              `json:"state"`
	Fingerprint string              `json:"fingerprint"`
	Upstream    string              `json:"upstream,omitempty"`
	Status      int                 `json:"status,omitempty"`
	Stream      bool                `json:"stream"`
	Events      int                 `json:"events,omitempty"`
	SizeBytes   int                 `json:"size_bytes"`
	LeaseUntil  *time.Time          `json:"lease_until,omitempty"`
	CreatedAt   *time.Time          `json:"created_at,omitempty"`
	ExpiresAt   *time.Time          `json:"expires_at,omitempty"`
	Header      map[string][]string `json:"header,omitempty"`
	Body        string              `json:"body,omitempty"`
	BodyBase64  string              `json:"body_base64,omitempty"`
}

func tp(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// adminKeys resolves the key and endpoints an admin request names:
// /admin/idempotency/<key>?client=NAME[&endpoint=/v1/chat/completions].
// The key is the rest of the path, unescaped, so keys with '/' work.
func (a *Admin) adminKeys(c echo.Context) ([]cache.Key, error) {
	id, err := pathParam(c, "*")
	if err != nil || id == "" {
		return nil, apierror.Invalid("key", "Name the key: /admin/idempotency/<key>?client=<name>.")
	}
	client := c.QueryParam("client")
	eps := []string{}
	if ep := c.QueryParam("endpoint"); ep != "" {
		if !strings.HasPrefix(ep, "/") {
			ep = "/v1/" + ep
		}
		eps = append(eps, ep)
	} else {
		eps = append(eps, a.endpoints...)
	}
	keys := make([]cache.Key, 0, len(eps))
	for _, ep := range eps {
		keys = append(keys, cache.Key{Scope: client, Endpoint: ep, ID: id})
	}
	return keys, nil
}

func (a *Admin) adminGetKey(c echo.Context) error {
	keys, err := a.adminKeys(c)
	if err != nil {
		return err
	}
	withBody := c.QueryParam("body") == "1"
	var views []recordView
	for _, k := range keys {
		rec, err := a.store.Get(c.Request().Context(), k)
		if errors.Is(err, cache.ErrNotFound) {
			continue
		}
		if err != nil {
			return storeErr(err)
		}
		v := recordView{
			Client: k.Scope, Endpoint: k.Endpoint, State: rec.State.String(), Fingerprint: rec.Fingerprint,
			Upstream: rec.Upstream, Status: rec.Status, Stream: rec.Stream, Events: len(rec.Events),
			SizeBytes: rec.Size(), CreatedAt: tp(rec.CreatedAt), ExpiresAt: tp(rec.ExpiresAt),
		}
		if rec.State == cache.InFlight {
			v.LeaseUntil = tp(rec.LeaseUntil)
		}
		if withBody {
			v.Header = rec.Header
			var b []byte
			if rec.Stream {
				for _, ev := range rec.Events {
					b = append(b, ev...)
				}
			} else {
				b = rec.Body
			}
			v.Body = string(b)
			if !isUTF8(b) {
				v.Body, v.BodyBase64 = "", base64.StdEncoding.EncodeToString(b)
			}
		}
		views = append(views, v)
	}
	if len(views) == 0 {
		return apierror.NotFound("idempotency_key_not_found", "", "No record for this key and client.")
	}
	return c.JSON(http.StatusOK, map[string]any{"records": views})
}

func (a *Admin) adminDeleteKey(c echo.Context) error {
	keys, err := a.adminKeys(c)
	if err != nil {
		return err
	}
	deleted := 0
	for _, k := range keys {
		err := a.store.Delete(c.Request().Context(), k)
		if errors.Is(err, cache.ErrNotFound) {
			continue
		}
		if err != nil {
			return storeErr(err)
		}
		deleted++
	}
	if deleted == 0 {
		return apierror.NotFound("idempotency_key_not_found", "", "No record for this key and client.")
	}
	a.log.Warn("idempotency key forgotten by operator", "idempotency_key", idempotency.HashKey(keys[0]), "client", keys[0].Scope)
	return c.JSON(http.StatusOK, map[string]int{"deleted": deleted})
}

func (a *Admin) adminStats(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]any{
		"store":       a.store.Stats(),
		"idempotency": a.metrics.IdemCounts(),
	})
}

func isUTF8(b []byte) bool { return utf8.Valid(b) }
