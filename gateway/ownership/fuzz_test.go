package ownership

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/llmgate/llmgate/classify/jsonscan"
)

// FuzzStoreFalse: for any JSON object, StoreFalse's output is a JSON object
// whose store is false and whose other members are the input's.
func FuzzStoreFalse(f *testing.F) {
	for _, s := range []string{`{}`, `{"store":true}`, `{"a":1,"store":{"x":[1,2]},"b":"store"}`, ` {"st\u006fre" : "yes" } `, `{"model":"m","input":[{"store":true}]}`} {
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
		delete(got, "store")
		delete(in, "store")
		if !reflect.DeepEqual(got, in) {
			t.Fatalf("StoreFalse(%q) = %q changed other members", body, out)
		}
		if Stored(out) {
			t.Fatalf("Stored(StoreFalse(%q)) = true", body)
		}
	})
}

// repeatsStore reports a top-level store given twice, which the gateway
// refuses before StoreFalse could see it.
func repeatsStore(body []byte) bool {
	n := 0
	s := jsonscan.New(body, 0)
	for range s.Fields(storeKeys) {
		n++
	}
	return n > 1
}
