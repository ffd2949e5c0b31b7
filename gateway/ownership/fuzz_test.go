package ownership

import (
	"encoding/json"
	"maps"
	"reflect"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/classify/jsonscan"
)

// FuzzStoreFalse: for any JSON object, StoreFalse's output is a JSON object
// whose store is false, to an exact-case decoder and to encoding/json
// decoding a struct (which folds keys), and whose other members are the
// input's.
func FuzzStoreFalse(f *testing.F) {
	for _, s := range []string{`{}`, `{"store":true}`, `{"a":1,"store":{"x":[1,2]},"b":"store"}`, ` {"st\u006fre" : "yes" } `, `{"model":"m","input":[{"store":true}]}`, `{"STORE":true}`, `{"\u017ftore":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var in map[string]any
		if json.Unmarshal(body, &in) != nil || in == nil || repeatsStore(body) {
			return
		}
		out := StoreFalse(body)
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("StoreFalse(%q) = %q, not JSON: %v", body, out, err)
		}
		if got["store"] != false {
			t.Fatalf("StoreFalse(%q) = %q: store is %v", body, out, got["store"])
		}
		var goUpstream struct {
			Store any `json:"store"`
		}
		if json.Unmarshal(out, &goUpstream) != nil || goUpstream.Store != false {
			t.Fatalf("StoreFalse(%q) = %q: store is %v to a Go upstream", body, out, goUpstream.Store)
		}
		for k, v := range got {
			if strings.EqualFold(k, "store") && v != false {
				t.Fatalf("StoreFalse(%q) = %q: %s is %v", body, out, k, v)
			}
		}
		maps.DeleteFunc(got, func(k string, _ any) bool { return strings.EqualFold(k, "store") })
		maps.DeleteFunc(in, func(k string, _ any) bool { return strings.EqualFold(k, "store") })
		if !reflect.DeepEqual(got, in) {
			t.Fatalf("StoreFalse(%q) = %q changed other members", body, out)
		}
		if Stored(out) {
			t.Fatalf("Stored(StoreFalse(%q)) = true", body)
		}
	})
}

// repeatsStore reports a top-level store given twice, in any case, which
// the gateway refuses before StoreFalse could see it.
func repeatsStore(body []byte) bool {
	n := 0
	s := jsonscan.New(body, 0)
	for range s.Fields(storeKeys) {
		n++
	}
	return n > 1
}

// FuzzFromMessagesBody: for any JSON body, every file_id a decoder reads
// where Anthropic resolves one — a content block's source.file_id (also
// inside a tool_result's content) and a block's own file_id — and the
// top-level container's id are among what FromMessagesBody returns (a
// tool use's input, which it does not read, is no such place).
func FuzzFromMessagesBody(f *testing.F) {
	for _, s := range []string{
		`{"container":"c1","messages":[{"role":"user","content":[{"type":"document","source":{"type":"file","file_id":"f1"}}]}]}`,
		`{"container":{"id":"c2"},"messages":[{"content":[{"type":"tool_result","content":[{"type":"image","source":{"file_id":"f2"}}]}]}]}`,
		`{"messages":[{"content":[{"type":"tool_use","input":{"file_id":"x"}},{"type":"container_upload","file_id":"f3"}]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		type block struct {
			Type    string          `json:"type"`
			FileID  any             `json:"file_id"`
			Source  json.RawMessage `json:"source"`
			Content json.RawMessage `json:"content"`
		}
		var req struct {
			Container json.RawMessage `json:"container"`
			Messages  []struct {
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
		}
		if json.Unmarshal(body, &req) != nil {
			return
		}
		found := map[string]bool{}
		for _, r := range FromMessagesBody(body) {
			found[string(r.Kind)+":"+r.ID] = true
		}
		var want []string
		var blocks func(raw json.RawMessage, depth int)
		blocks = func(raw json.RawMessage, depth int) {
			var bs []block
			if depth > 3 || json.Unmarshal(raw, &bs) != nil {
				return
			}
			for _, b := range bs {
				if id, ok := b.FileID.(string); ok {
					want = append(want, "file:"+id)
				}
				var src struct {
					FileID any `json:"file_id"`
				}
				if json.Unmarshal(b.Source, &src) == nil {
					if id, ok := src.FileID.(string); ok {
						want = append(want, "file:"+id)
					}
				}
				blocks(b.Content, depth+1)
			}
		}
		for _, m := range req.Messages {
			blocks(m.Content, 0)
		}
		var c struct {
			ID any `json:"id"`
		}
		var cs string
		if json.Unmarshal(req.Container, &cs) == nil && req.Container != nil {
			want = append(want, "container:"+cs)
		} else if json.Unmarshal(req.Container, &c) == nil {
			if id, ok := c.ID.(string); ok {
				want = append(want, "container:"+id)
			}
		}
		for _, w := range want {
			if !found[w] {
				t.Fatalf("FromMessagesBody(%q) misses %s (found %v)", body, w, found)
			}
		}
	})
}
