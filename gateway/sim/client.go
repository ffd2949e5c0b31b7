package sim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/llmgate/llmgate/gateway"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

// Client modes.
const (
	ModeNormal   = "normal"   // waits for the whole answer
	ModeLeave    = "leave"    // hangs up partway (after some events, or some time)
	ModeDeadline = "deadline" // sends a short X-Llmgate-Deadline
	ModeDup      = "dup"      // one of two or three identical requests sent at once
	ModeFinal    = "final"    // the retry of every key at quiescence, faults off
)

// keySpec is what a key's requests ask for.
type keySpec struct {
	id     string
	stream bool
	big    bool // an answer over the record limits: served once, a marker kept
}

func (k keySpec) body(variant int) string {
	big := 0
	if k.big {
		big = 1
	}
	return fmt.Sprintf(`{"model":"sim","stream":%v,"messages":[{"role":"user","content":"key=%s variant=%d big=%d"}]}`,
		k.stream, k.id, variant, big)
}

// request is one client request to send.
type request struct {
	key      keySpec
	variant  int
	mode     string
	leaveAt  int           // leave: after this many events (stream)
	leaveDur time.Duration // leave: after this long (JSON)
	deadline time.Duration // deadline: X-Llmgate-Deadline
}

// send makes the request and records what the client saw.
func send(hc *http.Client, url string, rq request, h *History) *Op {
	o := &Op{Key: rq.key.id, Variant: rq.variant, Stream: rq.key.stream, Big: rq.key.big, Mode: rq.mode, Start: h.since()}
	defer func() { o.End = h.since(); h.addOp(o) }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if rq.mode == ModeLeave && !rq.key.stream {
		t := time.AfterFunc(rq.leaveDur, cancel)
		defer t.Stop()
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(rq.key.body(rq.variant)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", rq.key.id)
	if rq.mode == ModeDeadline {
		req.Header.Set(gateway.DeadlineHeader, fmt.Sprintf("%dms", rq.deadline.Milliseconds()))
	}
	res, err := hc.Do(req)
	if err != nil {
		o.ClientCut = ctx.Err() != nil
		if !o.ClientCut {
			o.ReadErr = err.Error()
		}
		return o
	}
	defer res.Body.Close()
	o.Status = res.StatusCode
	o.Replayed = res.Header.Get("Idempotent-Replayed") == "true"
	if rq.key.stream && res.StatusCode == http.StatusOK {
		readStream(res.Body, o, rq, cancel)
	} else {
		o.Body, err = io.ReadAll(res.Body)
		if err != nil {
			o.ClientCut = ctx.Err() != nil
			if !o.ClientCut {
				o.ReadErr = err.Error()
			}
		}
	}
	o.Trailer = res.Trailer.Get(idempotency.CommittedTrailer)
	o.Run = runOf(o.Body)
	o.ErrorEvent = bytes.Contains(o.Body, []byte(`data: {"error"`))
	switch {
	case o.Status != http.StatusOK:
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(o.Body, &e)
		o.Code = e.Error.Code
	case o.ClientCut || o.ReadErr != "":
	case o.Stream:
		o.Complete = bytes.HasSuffix(o.Body, []byte("data: [DONE]\n\n")) && !o.ErrorEvent
	default:
		o.Complete = o.Run != 0
	}
	o.Hash, o.Size = sha256.Sum256(o.Body), len(o.Body)
	if o.Complete || !o.Stream {
		o.Body = nil
	}
	return o
}

// readStream reads a stream's events into o; a leaving client hangs up
// after rq.leaveAt of them.
func readStream(r io.Reader, o *Op, rq request, cancel func()) {
	buf := make([]byte, 4096)
	for {
		n, err := r.Read(buf)
		o.Body = append(o.Body, buf[:n]...)
		if rq.mode == ModeLeave && bytes.Count(o.Body, []byte("\n\n")) >= rq.leaveAt && !bytes.HasSuffix(o.Body, []byte("data: [DONE]\n\n")) {
			cancel()
			o.ClientCut = true
			return
		}
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			o.ReadErr = err.Error()
			return
		}
	}
}
