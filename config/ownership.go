package config

import (
	"fmt"
	"slices"
	"time"
)

// Ownership configures how llmgate keeps tenants apart on provider objects
// (stored responses, conversations, files, batches, vector stores,
// uploads) when clients share an upstream's API key: it remembers which
// client created each object id, for as long as the provider keeps the
// object, and answers 404 for an id that is not the asking client's. A
// client with its own key for an upstream (Client.UpstreamAPIKeys) is kept
// apart by the provider itself.
type Ownership struct {
	// TTL is how long the owner of each kind of object is remembered:
	// after it, the object's id is unknown to llmgate and refused (404),
	// even to its owner. Match it to the provider's retention. Each must be
	// > 0.
	TTL OwnershipTTL `yaml:"ttl"`
}

// OwnershipTTL is Ownership.TTL, by kind of object.
type OwnershipTTL struct {
	// Responses: stored responses (resp_...). Default 720h (30 days,
	// OpenAI's retention of stored responses).
	Responses Duration `yaml:"responses"`
	// Conversations: Default 2160h (90 days; OpenAI keeps them until
	// deleted).
	Conversations Duration `yaml:"conversations"`
	// Files: Default 2160h (90 days; kept until deleted or their
	// expires_after).
	Files Duration `yaml:"files"`
	// Batches: Default 720h (30 days).
	Batches Duration `yaml:"batches"`
	// VectorStores: Default 2160h (90 days; kept until deleted or their
	// expires_after).
	VectorStores Duration `yaml:"vector_stores"`
	// Uploads: Default 24h (OpenAI expires an upload an hour after it is
	// created; the file it completes into is a file).
	Uploads Duration `yaml:"uploads"`
}

// DefaultOwnership is Ownership's defaults (see OwnershipTTL).
func DefaultOwnership() Ownership {
	const day = 24 * time.Hour
	return Ownership{TTL: OwnershipTTL{
		Responses:     Duration(30 * day),
		Conversations: Duration(90 * day),
		Files:         Duration(90 * day),
		Batches:       Duration(30 * day),
		VectorStores:  Duration(90 * day),
		Uploads:       Duration(day),
	}}
}

func (c *Config) validateOwnership(p *problems) {
	t := c.Ownership.TTL
	for _, d := range []struct {
		field string
		d     Duration
	}{
		{"responses", t.Responses}, {"conversations", t.Conversations}, {"files", t.Files},
		{"batches", t.Batches}, {"vector_stores", t.VectorStores}, {"uploads", t.Uploads},
	} {
		if d.d <= 0 {
			p.add("ownership.ttl."+d.field, "%s must be > 0 (how long the owner of such an object is remembered; e.g. 720h)", d.d)
		}
	}
	names := make([]string, 0, len(c.Upstreams))
	for _, u := range c.Upstreams {
		names = append(names, u.Name)
	}
	for i, cl := range c.Clients {
		ups := make([]string, 0, len(cl.UpstreamAPIKeys))
		for u := range cl.UpstreamAPIKeys {
			ups = append(ups, u)
		}
		slices.Sort(ups) // one order for the messages
		for _, u := range ups {
			f := fmt.Sprintf("clients[%d].upstream_api_keys.%s", i, u)
			switch {
			case !slices.Contains(names, u):
				p.add(f, "%q is not a configured upstream (the keys of upstream_api_keys are upstream names: %v)", u, names)
			case cl.UpstreamAPIKeys[u] == "":
				// The value is a secret: never echo it (it is empty anyway).
				p.add(f, "empty (remove the entry to use the upstream's api_key)")
			}
		}
	}
}
