package config

import (
	"fmt"
	"strings"
)

// PassthroughPrefixes are the OpenAI API paths llmgate relays as a
// passthrough (no completion to classify): each with everything under it.
// A passthrough route's prefix is one of them or a path under one.
var PassthroughPrefixes = []string{
	"/v1/moderations", "/v1/images", "/v1/audio", "/v1/files", "/v1/uploads",
	"/v1/batches", "/v1/vector_stores", "/v1/conversations", "/v1/responses",
}

// Passthrough configures the passthrough endpoints (moderations, images,
// audio, files, uploads, batches, vector stores, conversations, stored
// responses): where a request that names no model goes, how large its body
// and recorded answer may be, and how large bodies are spooled.
type Passthrough struct {
	// Routes set, per path prefix, the upstream a request without a body
	// model goes to and the route's limits. The longest matching prefix
	// wins; a path no route matches goes to the first upstream, with the
	// default limits.
	Routes []Route `yaml:"routes"`
	// SpoolDir holds request bodies larger than MemoryBodyBytes while they
	// are sent (removed when the request ends; unlinked at once where the
	// OS allows, so a crash leaves nothing). If empty, os.TempDir().
	SpoolDir string `yaml:"spool_dir"`
	// MemoryBodyBytes: a non-JSON body (multipart, binary) up to this size
	// is held in memory, a larger one spooled to SpoolDir. If 0, 1 MiB.
	MemoryBodyBytes int64 `yaml:"memory_body_bytes"`
	// SpoolMaxBytes: a body that declares a Content-Length over this is
	// not spooled but streamed to the upstream as it arrives: sent once,
	// never retried nor sent to a fallback, and refused (413) with an
	// Idempotency-Key, which needs the whole body first. If 0, no limit
	// but the route's max_body_bytes: every body can be resent.
	SpoolMaxBytes int64 `yaml:"spool_max_bytes"`
	// SpoolMaxTotalBytes bounds the bytes spooled to SpoolDir across all
	// requests, reserved as they are written: an upload that finds no room
	// waits limits.admission_wait, then gets 503 gateway_overloaded with
	// Retry-After. The bytes are given back when the request (or its
	// keyed call, which may outlive it) ends. A body larger than the bound
	// is spooled alone. One client may hold at most half of it (at least
	// one body of the largest size a route takes); past that its next
	// upload is refused at once. If 0, DefaultSpoolMaxTotalBytes.
	SpoolMaxTotalBytes int64 `yaml:"spool_max_total_bytes"`
}

// DefaultSpoolMaxTotalBytes is passthrough.spool_max_total_bytes when 0:
// four 512 MiB uploads.
const DefaultSpoolMaxTotalBytes = 2 << 30

// Route is one passthrough route's settings.
type Route struct {
	// Prefix is a path under /v1, e.g. /v1/files or /v1/audio/speech
	// (no trailing slash); see PassthroughPrefixes.
	Prefix string `yaml:"prefix"`
	// Upstream is the upstream a request with no model in its body goes
	// to, when it speaks the request's API (a /v1/files route naming an
	// Anthropic upstream serves the Files API requests that send
	// anthropic-version; the others keep their default). If empty, the
	// first upstream of the request's API.
	Upstream string `yaml:"upstream"`
	// MaxBodyBytes caps a request body. If 0, 512 MiB under /v1/files and
	// /v1/uploads (OpenAI takes files up to 512 MB), else
	// limits.max_body_bytes.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxRecordBytes caps an answer committed under an Idempotency-Key;
	// a larger one is served once and a not-stored marker committed. If 0,
	// idempotency.max_record_bytes.
	MaxRecordBytes int64 `yaml:"max_record_bytes"`
}

// DefaultUploadBodyBytes is the body limit of /v1/files and /v1/uploads.
const DefaultUploadBodyBytes = 512 << 20

func (c *Config) validatePassthrough(p *problems) {
	names := make(map[string]bool, len(c.Upstreams))
	for _, u := range c.Upstreams {
		names[u.Name] = true
	}
	seen := map[string]bool{}
	for i, r := range c.Passthrough.Routes {
		f := fmt.Sprintf("passthrough.routes[%d]", i)
		switch {
		case !passthroughPrefix(r.Prefix):
			p.add(f+".prefix", "%q is not a passthrough path (use one of %s, or a path under one, without a trailing slash)",
				r.Prefix, strings.Join(PassthroughPrefixes, ", "))
		case seen[r.Prefix]:
			p.add(f+".prefix", "%q is listed twice", r.Prefix)
		}
		seen[r.Prefix] = true
		if r.Upstream != "" && !names[r.Upstream] {
			p.add(f+".upstream", "unknown upstream %q (name one under upstreams, or leave it empty for the first)", r.Upstream)
		}
		if r.MaxBodyBytes < 0 {
			p.add(f+".max_body_bytes", "must be >= 0 (0 means the default)")
		}
		if r.MaxRecordBytes < 0 {
			p.add(f+".max_record_bytes", "must be >= 0 (0 means idempotency.max_record_bytes)")
		}
	}
	if c.Passthrough.MemoryBodyBytes < 0 {
		p.add("passthrough.memory_body_bytes", "must be >= 0 (0 means 1 MiB)")
	}
	if c.Passthrough.SpoolMaxBytes < 0 {
		p.add("passthrough.spool_max_bytes", "must be >= 0 (0 means no limit but the route's max_body_bytes)")
	}
	if c.Passthrough.SpoolMaxTotalBytes < 0 {
		p.add("passthrough.spool_max_total_bytes", "must be >= 0 (0 means 2 GiB)")
	}
}

// passthroughPrefix reports whether s is one of PassthroughPrefixes or a
// clean path under one.
func passthroughPrefix(s string) bool {
	if strings.HasSuffix(s, "/") || strings.ContainsAny(s, "?#*% \t") || strings.Contains(s, "//") ||
		strings.Contains(s, "/./") || strings.Contains(s, "/../") || strings.HasSuffix(s, "/..") || strings.HasSuffix(s, "/.") {
		return false
	}
	for _, pre := range PassthroughPrefixes {
		if s == pre || strings.HasPrefix(s, pre+"/") {
			return true
		}
	}
	return false
}
