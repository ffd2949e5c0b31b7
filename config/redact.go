package config

import (
	"net/url"
	"slices"
)

// RedactedValue replaces a secret in Redacted's output.
const RedactedValue = "<redacted>"

// Redacted returns a copy of c that is safe to print or serve: upstream API
// keys (clients' own upstream_api_keys too), client keys and key hashes and the admin token become "<redacted>"
// (empty ones stay empty, so an unset secret shows as unset); user
// information and query values in store.redis.url and every base_url are
// replaced; and dead_letters.webhook_url keeps only its scheme and host,
// since Slack webhooks carry their token in the path; tracing.endpoint is
// redacted as base_url is. c is not modified.
func (c *Config) Redacted() Config {
	r := *c
	r.AdminToken = redact(r.AdminToken)
	r.Idempotency.ForwardKeySecret = redact(r.Idempotency.ForwardKeySecret)
	r.Upstreams = slices.Clone(c.Upstreams)
	for i := range r.Upstreams {
		u := &r.Upstreams[i]
		u.APIKey = redact(u.APIKey)
		u.BaseURL = redactURL(u.BaseURL, false)
		u.Models = slices.Clone(u.Models)
		u.Fallbacks = slices.Clone(u.Fallbacks)
		if u.PropagateTrace != nil {
			v := *u.PropagateTrace
			u.PropagateTrace = &v
		}
	}
	r.Clients = slices.Clone(c.Clients)
	for i := range r.Clients {
		r.Clients[i].Key = redact(r.Clients[i].Key)
		r.Clients[i].KeySHA256 = redact(r.Clients[i].KeySHA256)
		if keys := r.Clients[i].UpstreamAPIKeys; keys != nil {
			r.Clients[i].UpstreamAPIKeys = make(map[string]string, len(keys))
			for u, k := range keys {
				r.Clients[i].UpstreamAPIKeys[u] = redact(k)
			}
		}
	}
	r.Store.Redis.URL = redactURL(r.Store.Redis.URL, false)
	r.Store.Redis.Sentinel.Password = redact(r.Store.Redis.Sentinel.Password)
	r.Store.Redis.Sentinel.Addrs = slices.Clone(r.Store.Redis.Sentinel.Addrs)
	r.DeadLetters.WebhookURL = redactURL(r.DeadLetters.WebhookURL, true)
	r.Tracing.Endpoint = redactURL(r.Tracing.Endpoint, false)
	return r
}

func redact(s string) string {
	if s == "" {
		return ""
	}
	return RedactedValue
}

// redactURL hides a URL's user information, query values and fragment, and
// with path also its path. A URL that does not parse is hidden whole, as there is no
// telling where its secret is.
func redactURL(s string, path bool) string {
	if s == "" {
		return ""
	}
	u, err := url.Parse(s)
	if err != nil || u.Opaque != "" {
		return RedactedValue
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "redacted")
		} else {
			// A lone user name may be a token (redis://token@host).
			u.User = url.User("redacted")
		}
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			q[k] = []string{"redacted"}
		}
		u.RawQuery = q.Encode()
	}
	u.Fragment, u.RawFragment = "", ""
	if path && (u.Path != "" || u.RawPath != "") {
		u.Path, u.RawPath = "/redacted", ""
	}
	return u.String()
}
