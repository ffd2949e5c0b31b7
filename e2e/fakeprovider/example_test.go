package fakeprovider_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// A test scripts the upstream, drives the code under test, then asserts
// on what the upstream saw.
func Example() {
	fake := fakeprovider.New(fakeprovider.Options{})
	srv := httptest.NewServer(fake)
	defer srv.Close()
	defer fake.Close()

	fake.Enqueue(fakeprovider.Step{Status: 503, Header: map[string]string{"Retry-After": "1"}})
	for range 2 {
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Printf("%d Retry-After=%q\n", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	fmt.Println(fake.Calls("/v1/chat/completions"), "calls")
	// Output:
	// 503 Retry-After="1"
	// 200 Retry-After=""
	// 2 calls
}
