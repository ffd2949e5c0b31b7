package request

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestRewriteResultsURLs: only the value of a results_url string — in the
// answer's own object and in each object of its data array — changes, to
// the gateway's URL of that object's id; every other byte stays.
func TestRewriteResultsURLs(t *testing.T) {
	urlOf := func(id string) string { return "https://gw.example/v1/messages/batches/" + id + "/results" }
	const up = `"https://api.anthropic.com/v1/messages/batches/msgbatch_1/results"`
	for _, tc := range []struct{ name, in, want string }{
		{"batch", `{"id":"msgbatch_1","results_url":` + up + `}`,
			`{"id":"msgbatch_1","results_url":"https://gw.example/v1/messages/batches/msgbatch_1/results"}`},
		{"id after the url, spacing kept", `{ "results_url" : ` + up + ` , "id" : "msgbatch_2" }`,
			`{ "results_url" : "https://gw.example/v1/messages/batches/msgbatch_2/results" , "id" : "msgbatch_2" }`},
		{"null stays null", `{"id":"msgbatch_1","results_url":null,"x":1}`, `{"id":"msgbatch_1","results_url":null,"x":1}`},
		{"list", `{"data":[{"id":"a","results_url":` + up + `},{"id":"b","results_url":null},{"id":"c","results_url":` + up + `}],"has_more":true}`,
			`{"data":[{"id":"a","results_url":"https://gw.example/v1/messages/batches/a/results"},{"id":"b","results_url":null},` +
				`{"id":"c","results_url":"https://gw.example/v1/messages/batches/c/results"}],"has_more":true}`},
		// A key a Go decoder reads as results_url is rewritten too; each
		// duplicate, with the id a decoder keeps (the last).
		{"folded and repeated keys", `{"id":"old","Results_URL":` + up + `,"results_\u0075rl":` + up + `,"id":"new"}`,
			`{"id":"old","Results_URL":"https://gw.example/v1/messages/batches/new/results","results_\u0075rl":"https://gw.example/v1/messages/batches/new/results","id":"new"}`},
		{"no id: null, never the provider's", `{"results_url":` + up + `}`, `{"results_url":null}`},
		{"nested members untouched", `{"id":"m","metadata":{"results_url":"keep"},"results_url":null}`,
			`{"id":"m","metadata":{"results_url":"keep"},"results_url":null}`},
		{"not an object", `[{"results_url":` + up + `}]`, `[{"results_url":` + up + `}]`},
		{"no results_url", `{"id":"msgbatch_1","type":"message_batch_deleted"}`, `{"id":"msgbatch_1","type":"message_batch_deleted"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(rewriteResultsURLs([]byte(tc.in), urlOf)); got != tc.want {
				t.Errorf("rewriteResultsURLs\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestResultsURL: the gateway's results URL of a batch, its id escaped as
// one path segment; with no Host (an in-process replay) the path alone.
func TestResultsURL(t *testing.T) {
	g := &Handler{}
	r := httptest.NewRequest(http.MethodGet, "http://gw.example:8080/v1/messages/batches", nil)
	if got, want := g.resultsURL(r)("msgbatch_a/b c"), "http://gw.example:8080/v1/messages/batches/msgbatch_a%2Fb%20c/results"; got != want {
		t.Errorf("resultsURL = %q, want %q", got, want)
	}
	r.Host = ""
	if got, want := g.resultsURL(r)("msgbatch_1"), "/v1/messages/batches/msgbatch_1/results"; got != want {
		t.Errorf("resultsURL with no Host = %q, want %q", got, want)
	}
}
