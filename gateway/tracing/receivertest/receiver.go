// Package receivertest is an in-process OTLP/HTTP traces receiver for
// tests: a real HTTP endpoint at /v1/traces that decodes each protobuf
// ExportTraceServiceRequest, as a collector would, and keeps its spans in a
// form a test can assert on. It is what the gateway's exporter really sends
// that a test sees, not what an in-memory exporter was handed.
package receivertest

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span. IDs are lower-case hex, as in traceparent;
// a root span's ParentSpanID is "".
type Span struct {
	TraceID, SpanID, ParentSpanID string
	Name                          string
	Kind                          tracepb.Span_SpanKind
	Attrs                         map[string]any // string, int64, float64, bool or []any of them
	Events                        []Event
	Links                         []Link
	StatusCode                    tracepb.Status_StatusCode
	StatusMessage                 string
	Resource                      map[string]any
	Scope                         string
}

// Event is a span event.
type Event struct {
	Name  string
	Attrs map[string]any
}

// Link is a span link.
type Link struct {
	TraceID, SpanID string
	Attrs           map[string]any
}

// Receiver collects the spans exported to URL. Create it with New.
type Receiver struct {
	// URL is the traces endpoint, ending in /v1/traces.
	URL string
	// Base is the server's root URL, for an exporter that appends
	// /v1/traces itself.
	Base string

	mu       sync.Mutex
	spans    []Span
	requests int
	errs     []error
}

// New starts a Receiver; it stops when the test ends. A request the
// receiver cannot decode fails the test (when it ends, from the test's
// goroutine).
func New(t testing.TB) *Receiver {
	r := &Receiver{}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		srv.Close()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, err := range r.errs {
			t.Errorf("OTLP receiver: %v", err)
		}
	})
	r.Base, r.URL = srv.URL, srv.URL+"/v1/traces"
	return r
}

// Spans returns every span received so far, in the order received.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Requests counts the export requests received.
func (r *Receiver) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	spans, err := decode(req)
	r.mu.Lock()
	r.requests++
	if err != nil {
		r.errs = append(r.errs, err)
	}
	r.spans = append(r.spans, spans...)
	r.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func decode(req *http.Request) ([]Span, error) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		return nil, fmt.Errorf("%s %s, want POST /v1/traces", req.Method, req.URL.Path)
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		return nil, fmt.Errorf("Content-Type %q, want application/x-protobuf", ct)
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			return nil, err
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		return nil, fmt.Errorf("decoding ExportTraceServiceRequest: %w", err)
	}
	var out []Span
	for _, rs := range msg.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()),
					Name:         s.GetName(), Kind: s.GetKind(), Attrs: attrs(s.GetAttributes()),
					StatusCode: s.GetStatus().GetCode(), StatusMessage: s.GetStatus().GetMessage(),
					Resource: res, Scope: ss.GetScope().GetName(),
				}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, Event{Name: e.GetName(), Attrs: attrs(e.GetAttributes())})
				}
				for _, l := range s.GetLinks() {
					sp.Links = append(sp.Links, Link{TraceID: hex.EncodeToString(l.GetTraceId()),
						SpanID: hex.EncodeToString(l.GetSpanId()), Attrs: attrs(l.GetAttributes())})
				}
				out = append(out, sp)
			}
		}
	}
	return out, nil
}

func attrs(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_ArrayValue:
		var out []any
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, value(e))
		}
		return out
	case *commonpb.AnyValue_BytesValue:
		return x.BytesValue
	case *commonpb.AnyValue_KvlistValue:
		return attrs(x.KvlistValue.GetValues())
	}
	return nil
}

// Strings returns every string in s that a secret could hide in: its name,
// the values of its attributes, its events' and links' attributes and its
// resource's, and the event names, flattened.
func (s Span) Strings() []string {
	out := []string{s.Name, s.StatusMessage}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			out = append(out, x)
		case []byte:
			out = append(out, string(x))
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for k, e := range x {
				out = append(out, k)
				walk(e)
			}
		default:
			out = append(out, fmt.Sprint(x))
		}
	}
	walk(s.Attrs)
	walk(s.Resource)
	for _, e := range s.Events {
		out = append(out, e.Name)
		walk(e.Attrs)
	}
	for _, l := range s.Links {
		walk(l.Attrs)
	}
	return out
}
