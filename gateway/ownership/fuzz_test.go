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
