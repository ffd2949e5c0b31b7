package request

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/gateway/idempotency"
)

// TestParseRoutingErrors pins what a client is told about a malformed body:
// the messages and offsets below are the routing scanner's from before
// jsonscan, kept byte for byte.
func TestParseRoutingErrors(t *testing.T) {
	cases := []struct{ body, err string }{
		{``, "the request body must be a JSON object (at byte 0)"},
		{`   `, "the request body must be a JSON object (at byte 3)"},
		{`[]`, "the request body must be a JSON object (at byte 0)"},
		{"\ufeff{}", "the request body must be a JSON object (at byte 0)"},
		{`{`, "expected string (at byte 1)"},
		{`{"model"`, "expected ':' after object key (at byte 8)"},
		{`{"model":}`, "invalid value (at byte 9)"},
		{`{"model":"x"`, "expected ',' or '}' in object (at byte 13)"},
		{`{"model":"x" "y":1}`, "expected ',' or '}' in object (at byte 14)"},
		{`{"model":"x",}`, "expected string (at byte 13)"},
		{`{"a":1}x`, "unexpected data after the JSON object (at byte 7)"},
		{`{"a":tru}`, "invalid literal (at byte 5)"},
		{`{"a":-x}`, "invalid number (at byte 6)"},
		{`{"a":1e+}`, "invalid number (at byte 8)"},
		{`{"a":01}`, "expected ',' or '}' in object (at byte 7)"},
		{`{"a":"\u12g4"}`, "invalid escape (at byte 7)"},
		{"{\"a\":\"\x01\"}", "control character in string (at byte 6)"},
		{`{"a":"abc`, "unterminated string (at byte 9)"},
		{`{"a":[1,]}`, "invalid value (at byte 8)"},
		{`{"a":[1 2]}`, "expected ',' or closing bracket (at byte 8)"},
		{`{"a":{"b":1 "c":2}}`, "expected ',' or closing bracket (at byte 12)"},
		{`{"a":[[[[1]]]]}`, "JSON nested too deeply"},
		{`{"model":3}`, "model must be a string"},
		{`{"model":null}`, "model must be a string"},
		{`{"stream":"yes"}`, "stream must be a boolean"},
	}
	for _, c := range cases {
		_, err := parseRouting([]byte(c.body), 4)
		if fmt.Sprint(err) != c.err {
			t.Errorf("%q: %v, want %s", c.body, err, c.err)
		}
	}
}

// TestParseRoutingFields: what each field read yields, and that a field
// of another type than expected is tolerated unless it is model or stream
// (a count or background of another type is noted, for endpoint.typed).
func TestParseRoutingFields(t *testing.T) {
	cases := []struct {
		body string
		want string
	}{
		{`{"model":"m"}`, `model=m`},
		{`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, `model=m stream usage`},
		{`{"model":"m","stream":null,"stream_options":{"include_usage":"yes"}}`, `model=m`},
		{`{"model":"m","stream_options":null}`, `model=m`},
		{`{"model":"m","stream_options":{"include_usage":true,"include_usage":false}}`, `model=m`}, // nested: the last, as a decoder keeps
		{`{"model":"m","previous_response_id":"resp_1","background":true,"store":false}`, `model=m prev=resp_1 background store=false`},
		{`{"model":"m","store":true}`, `model=m store=true`},
		{`{"model":"m","store":null,"background":"yes","previous_response_id":7}`, `model=m background-untyped`},
		{`{"model":"m","conversation":"conv_1"}`, `model=m conv=conv_1`},
		{`{"model":"m","conversation":{"id":"conv_\u0032","x":[]}}`, `model=m conv=conv_2`},
		{`{"model":"m","conversation":{"id":5}}`, `model=m`},
		{`{"model":"m","conversation":[]}`, `model=m`},
		{`{"mod\u0065l":"m","\u0073tream":true}`, `model=m stream`},
		// Keys fold as a Go upstream's encoding/json folds them.
		{`{"MODEL":"m","STREAM":true}`, `model=m stream`},
		{`{"Model":"m","\u017ftream":true,"Stream_Options":{"INCLUDE_USAGE":true}}`, `model=m stream usage`},
		{`{"model":"m","PREVIOUS_RESPONSE_ID":"r","BAC\u212aGROUND":true,"ſtore":false,"Conversation":{"ID":"c"}}`, `model=m prev=r background store=false conv=c`},
		{`{"model":"m","messages":[{"model":"x","stream":"no"}]}`, `model=m`},
		// The output a request allows sizes its budget reservation: the
		// largest count set, others ignored.
		{`{"model":"m","max_tokens":256}`, `model=m max=256`},
		{`{"model":"m","max_completion_tokens":100,"max_tokens":50}`, `model=m max=100`},
		{`{"model":"m","max_output_tokens":64}`, `model=m max=64`},
		{`{"model":"m","max_tokens":null,"max_completion_tokens":"9","max_output_tokens":-3}`, `model=m uncounted=max_completion_tokens`},
		{`{"model":"m","n":[2],"best_of":true,"background":null}`, `model=m uncounted=n`},
		// A count written as a float is that count, as a decoder reads it
		// (a reservation must not take "8.0" for "not set"); a fraction
		// is no count.
		{`{"model":"m","max_tokens":1e2,"n":8.0}`, `model=m max=100 n=8`},
		{`{"model":"m","max_tokens":10.5,"best_of":3,"n":2}`, `model=m n=3`},
		// A count past the integer range is the most there is, not "not
		// set": a reservation of the default would let a provider that
		// reads big integers run to its cap on a small hold.
		{`{"model":"m","max_tokens":99999999999999999999}`, `model=m max=9223372036854775807`},
		{`{"model":"m","max_completion_tokens":1e300,"n":18446744073709551616}`, `model=m max=9223372036854775807 n=9223372036854775807`},
		{`{"model":"m","max_tokens":1e400}`, `model=m max=9223372036854775807`},
		{`{"model":"m","max_tokens":-99999999999999999999,"n":1.5e300}`, `model=m n=9223372036854775807`},
	}
	for _, c := range cases {
		r, err := parseRouting([]byte(c.body), 64)
		if err != nil {
			t.Errorf("%s: %v", c.body, err)
			continue
		}
		var got []string
		add := func(ok bool, s string) {
			if ok {
				got = append(got, s)
			}
		}
		add(true, "model="+r.Model)
		add(r.Stream, "stream")
		add(r.IncludeUsage, "usage")
		add(r.PreviousResponseID != "", "prev="+r.PreviousResponseID)
		add(r.Background, "background")
		add(r.Store == optTrue, "store=true")
		add(r.Store == optFalse, "store=false")
		add(r.ConversationID != "", "conv="+r.ConversationID)
		add(r.MaxTokens != 0, fmt.Sprintf("max=%d", r.MaxTokens))
		add(r.Choices != 0, fmt.Sprintf("n=%d", r.Choices))
		add(r.uncounted != "", "uncounted="+r.uncounted)
		add(r.untypedBackground, "background-untyped")
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("%s: %s, want %s", c.body, g, c.want)
		}
	}

	// Raw keeps the tolerated values as written.
	r, err := parseRouting([]byte(`{"model":"m","background":"yes","store":1,"conversation":{"id":5},"previous_response_id":null,"stream_options":[]}`), 64)
	if err != nil {
		t.Fatal(err)
	}
	raw := r.Raw
	if string(raw.Background) != `"yes"` || string(raw.Store) != `1` || string(raw.Conversation) != `{"id":5}` ||
		string(raw.PreviousResponseID) != `null` || string(raw.StreamOptions) != `[]` {
		t.Errorf("Raw = %q", raw)
	}
	if r, _ := parseRouting([]byte(`{"model":"m"}`), 64); r.Raw.Store != nil || r.Store != optUnset {
		t.Errorf("absent store: %q %v", r.Raw.Store, r.Store)
	}
}

// TestParseRoutingDuplicates: a field the gateway reads may appear once,
// however its key is escaped or cased; others may repeat.
func TestParseRoutingDuplicates(t *testing.T) {
	cases := []struct{ body, param string }{
		{`{"model":"gpt-4o-mini","mod\u0065l":"o1-pro"}`, "model"},
		{`{"model":"a","model":"a"}`, "model"},
		{`{"model":"a","stream":false,"\u0073\u0074\u0072\u0065\u0061\u006d":true}`, "stream"},
		{`{"model":"a","stream_options":{},"stream_options":{"include_usage":true}}`, "stream_options"},
		{`{"model":"a","previous_response_id":"r1","previous_response_id":"r2"}`, "previous_response_id"},
		{`{"model":"a","background":false,"background":true}`, "background"},
		{`{"model":"a","store":null,"store":true}`, "store"},
		{`{"model":"a","conversation":"c1","conversation":{"id":"c2"}}`, "conversation"},
		{`{"model":"a","messages":[],"messages":[],"temperature":0,"temperature":1}`, ""},
		// A budget's reservation must not read a smaller value than the
		// provider uses.
		{`{"model":"a","max_tokens":10,"max_tokens":100000}`, "max_tokens"},
		// Keys that fold alike, as a Go upstream's decoder reads them.
		{`{"model":"a","Model":"b","MODEL":"c"}`, "model"},
		{`{"model":"gpt-4o-mini","MODEL":"gpt-4o"}`, "model"},
		{`{"model":"a","stream":false,"\u017fTREAM":true}`, "stream"},
		{`{"model":"a","store":false,"ſtore":true}`, "store"},
		{`{"model":"a","background":false,"bac\u212aground":true}`, "background"},
		{`{"model":"a","previous_response_id":"r1","PREVIOUS_RESPONSE_ID":"r2"}`, "previous_response_id"},
		{`{"model":"a","previous_response_id":"r1","previou\u017f_response_id":"r2"}`, "previous_response_id"},
		{`{"model":"a","conversation":"c1","Conversation":"c2"}`, "conversation"},
		{`{"model":"a","stream_options":{},"STREAM_OPTIONS":{"include_usage":true}}`, "stream_options"},
		{`{"model":"a","messages":[],"MESSAGES":[]}`, ""},
	}
	for _, c := range cases {
		_, err := parseRouting([]byte(c.body), 64)
		var fe *fieldError
		switch {
		case c.param == "" && err != nil:
			t.Errorf("%s: %v", c.body, err)
		case c.param == "":
		case !errors.As(err, &fe) || fe.Param != c.param || fe.Code != "duplicate_field" || !strings.Contains(fe.Msg, "more than once"):
			t.Errorf("%s: %#v, want a duplicate_field error for %s", c.body, err, c.param)
		}
	}
}

// TestFingerprintStable: fingerprints are stored with idempotency records,
// so a change of scanner must not change them. The values are from before
// jsonscan, but for the body whose keys "\u0041" and "A" an upstream reads
// as one: such keys are ordered as read, and marked, since this round
// (idempotency.TestFingerprintKeysReadAlike).
func TestFingerprintStable(t *testing.T) {
	for body, want := range map[string]string{
		chatBody:   "a84de116f4fb40259a25b189747c92a06ccd935f8d3a32842f9ee5373f67129a",
		streamBody: "a0480d9de09bbeaffad1a872b570e9afb2c9d0db48f7b0ef00dddb4ebe031958",
		`{"b":1,"a":{"d":[1,{"z":0,"y":"x"}],"c":null}}`: "10d493daf55b344290d16d69dc7f722d65e206990318deb3716e161f199d3fa2",
		`{"\u0041":1,"A":2," x":[ 1 , 2 ]}`:              "193c8c2b73736691a3009fdbba126bc51281fc4ec258eeb7c1e29d23c4cfbaf7",
		`{}`:                                             "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
	} {
		if got := fingerprintOf(t, []byte(body)); got != want {
			t.Errorf("idempotency.Fingerprint(%s) = %s, want %s", body, got, want)
		}
	}
	if got := fingerprintOf(t, benchBody); got != "7e79c369489212e6b4e4a1cdd124678823ce4e5cc27df5d68ec54cd10ddf5dc7" {
		t.Errorf("idempotency.Fingerprint(benchBody) = %s", got)
	}
}

// fingerprintOf is idempotency.Fingerprint of a body within its bound.
func fingerprintOf(t testing.TB, body []byte) string {
	t.Helper()
	fp, err := idempotency.Fingerprint(body)
	if err != nil {
		t.Fatalf("Fingerprint(%.80s): %v", body, err)
	}
	return fp
}
