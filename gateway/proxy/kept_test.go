package proxy

import (
	"bytes"
	"net/http/httptest"
	"testing"
	"time"
	"unsafe"

	"github.com/llmgate/llmgate/gateway/sse"
)

// keptRecorder is a client's writer that keeps what WriteKept gives it.
type keptRecorder struct {
	*httptest.ResponseRecorder
	kept [][]byte
}

func (k *keptRecorder) WriteKept(b []byte) (int, error) {
	k.kept = append(k.kept, b)
	return k.Write(b)
}

// A recorded stream's events reach a KeptWriter as the recorder's own
// copies, the held tail's too, so that a keyed stream's live copy for
// joiners is not a second one; the client's bytes are the upstream's.
func TestRecordedEventsWrittenKept(t *testing.T) {
	stream := recorded(t, "thinking_tool_text.sse")
	p, _, resp := messagesExecute(t, stream)
	if resp.Stream == nil {
		t.Fatalf("no stream: %+v", resp.Outcome)
	}
	w := &keptRecorder{ResponseRecorder: httptest.NewRecorder()}
	rec := &sse.Recorder{MaxBytes: 1 << 20, MaxEvents: 1000}
	tail := p.RelayStream(w, resp, Relay{Start: time.Now(), Hold: true, Recorder: rec})
	if !tail.Held() {
		t.Fatal("no tail held")
	}
	tail.Release()
	if got := w.Body.Bytes(); !bytes.Equal(got, stream) {
		t.Fatalf("the client got\n%s\nwant the upstream's stream byte for byte", got)
	}
	events := rec.Events()
	if len(w.kept) != len(events) {
		t.Fatalf("%d writes kept, want one per recorded event (%d)", len(w.kept), len(events))
	}
	for i, b := range w.kept {
		if len(b) != len(events[i]) || unsafe.SliceData(b) != unsafe.SliceData(events[i]) {
			t.Fatalf("kept write %d is not the recorder's event %d itself", i, i)
		}
	}
}
