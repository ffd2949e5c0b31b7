package sse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// dataLine is a data line of exactly n bytes, its line ending not counted.
func dataLine(n int) string { return "data: " + strings.Repeat("x", n-len("data: ")) }

type readCase struct {
	name     string
	in       string
	maxEvent int // 0: no limit
	want     []string
	tail     string // what comes with the final error
	err      error
}

func readCases() []readCase {
	cases := []readCase{
		{name: "LF", in: "data: a\n\ndata: b\n\n", want: []string{"data: a\n\n", "data: b\n\n"}, err: io.EOF},
		{name: "CRLF", in: "data: a\r\n\r\ndata: b\r\n\r\n", want: []string{"data: a\r\n\r\n", "data: b\r\n\r\n"}, err: io.EOF},
		// Bug 2: an event framed with CR line endings was never split.
		{name: "CR", in: "data: a\r\rdata: b\r\r", want: []string{"data: a\r\r", "data: b\r\r"}, err: io.EOF},
		{name: "CR multi-line event", in: "event: x\rdata: a\rdata: b\r\r: ping\r\r",
			want: []string{"event: x\rdata: a\rdata: b\r\r", ": ping\r\r"}, err: io.EOF},
		{name: "mixed endings", in: "data: a\r\n\rdata: b\n\r\ndata: c\r\r\n",
			want: []string{"data: a\r\n\r", "data: b\n\r\n", "data: c\r\r\n"}, err: io.EOF},
		// CR then LF is one line ending, never a line and a blank line.
		{name: "CRLF is one ending", in: "data: a\r\ndata: b\r\n", tail: "data: a\r\ndata: b\r\n", err: io.ErrUnexpectedEOF},
		{name: "stray blank lines go with the next event", in: "\r\n\r\ndata: a\r\r\n\ndata: b\n\n",
			want: []string{"\r\n\r\ndata: a\r\r\n", "\ndata: b\n\n"}, err: io.EOF},
		{name: "CR at EOF ends a blank line", in: "data: a\n\r", want: []string{"data: a\n\r"}, err: io.EOF},
		{name: "CR at EOF ends a line", in: "data: a\r", tail: "data: a\r", err: io.ErrUnexpectedEOF},
		{name: "CRLF blank line at EOF", in: "data: a\r\n\r\n", want: []string{"data: a\r\n\r\n"}, err: io.EOF},
		{name: "CR at EOF after a CRLF line", in: "data: a\r\n\r", want: []string{"data: a\r\n\r"}, err: io.EOF},
		{name: "trailing blank lines dropped", in: "data: a\n\n\n\r\r\n", want: []string{"data: a\n\n"}, err: io.EOF},
		{name: "cut inside an event", in: "data: a\n\ndata: b", want: []string{"data: a\n\n"}, tail: "data: b", err: io.ErrUnexpectedEOF},
		{name: "empty", in: "", err: io.EOF},
		{name: "only blank lines", in: "\n\r\n\r", err: io.EOF},
		{name: "long lines in one event", in: dataLine(40000) + "\n" + dataLine(70000) + "\r\n" + dataLine(33000) + "\r\r",
			want: []string{dataLine(40000) + "\n" + dataLine(70000) + "\r\n" + dataLine(33000) + "\r\r"}, err: io.EOF},
		{name: "at the limit", in: dataLine(100000) + "\n\n", maxEvent: 100002, want: []string{dataLine(100000) + "\n\n"}, err: io.EOF},
		{name: "over the limit", in: dataLine(100000) + "\n\n", maxEvent: 100001, err: ErrEventTooLarge},
		{name: "stray blank lines count", in: "\n\n\ndata: a\n\n", maxEvent: 11, err: ErrEventTooLarge},
		{name: "cut event over the limit", in: "data: a\n\n" + dataLine(200), maxEvent: 100, want: []string{"data: a\n\n"}, err: ErrEventTooLarge},
	}
	// Bug 1: a line of exactly the buffer's size lost its blank line, and
	// so might any line whose ending falls on a buffer boundary.
	for _, n := range []int{32767, 32768, 32769, 65536, 100000} {
		for _, nl := range []string{"\n", "\r\n", "\r"} {
			first, done := dataLine(n)+nl+nl, "data: [DONE]"+nl+nl
			cases = append(cases, readCase{name: fmt.Sprintf("%d-byte line %q", n, nl),
				in: first + done, want: []string{first, done}, err: io.EOF})
		}
	}
	return cases
}

// TestReaderSplitsEvents reads each case whole, then through readers that
// cut it elsewhere: a byte at a time, at every line ending, at buffer-size
// offsets.
func TestReaderSplitsEvents(t *testing.T) {
	for _, tc := range readCases() {
		t.Run(tc.name, func(t *testing.T) {
			got, tail, err := readEvents(bytes.NewReader([]byte(tc.in)), tc.maxEvent)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if !equalEvents(got, tc.want) || tail != tc.tail {
				t.Fatalf("events\n%s\nwant\n%s\ntail %.40q, want %.40q", showEvents(got), showEvents(tc.want), tail, tc.tail)
			}
			in := []byte(tc.in)
			readers := map[string]func() io.Reader{
				"one byte at a time": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(in)) },
				"halves":             func() io.Reader { return iotest.HalfReader(bytes.NewReader(in)) },
				"EOF with the data":  func() io.Reader { return iotest.DataErrReader(bytes.NewReader(in)) },
			}
			if len(in) > 1000 {
				// One byte at a time costs a bufio fill per byte.
				delete(readers, "one byte at a time")
			}
			for _, at := range cutPoints(in) {
				readers[fmt.Sprintf("cut at %d", at)] = func() io.Reader { return &cutReader{data: in, cuts: []int{at}} }
			}
			for name, r := range readers {
				if err := checkAgainstSpec(in, r(), tc.maxEvent); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			}
		})
	}
}

// A CRLF cut between its CR and its LF is one line ending: the LF is not a
// blank line, whether the cut falls inside an event or at its end.
func TestReaderCRLFAcrossReads(t *testing.T) {
	in := []byte("data: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n")
	want := []string{"data: a\r\ndata: b\r\n\r\n", "data: c\r\n\r\n"}
	var afterCR []int
	for i, c := range in {
		if c == '\r' {
			afterCR = append(afterCR, i+1)
		}
	}
	for _, r := range []io.Reader{
		iotest.OneByteReader(bytes.NewReader(in)),
		&cutReader{data: in, cuts: afterCR},
	} {
		got, _, err := readEvents(r, 0)
		if err != io.EOF || !equalEvents(got, want) {
			t.Errorf("%T: %v\n%s\nwant\n%s", r, err, showEvents(got), showEvents(want))
		}
	}
}

// An event is returned as soon as its blank line is in, even when that
// blank line is a CR and nothing follows yet: the reader does not wait for
// an LF the event does not need. (An upstream that ends [DONE] with CRs and
// holds the connection open must not stall the stream.)
func TestReaderDoesNotWaitAfterCR(t *testing.T) {
	for _, in := range []string{"data: a\r\r", "data: a\n\r", "\r\n\r\ndata: a\r\r"} {
		pr, pw := io.Pipe()
		go func() { _, _ = pw.Write([]byte(in)) }() // and then nothing, until closed
		rd := NewReader(pr, 0)
		type next struct {
			ev  string
			err error
		}
		got := make(chan next, 1)
		go func() {
			ev, err := rd.Next()
			got <- next{string(ev), err}
		}()
		var first next
		select {
		case first = <-got:
		case <-time.After(10 * time.Second):
			// Not a timing claim: a reader that waits would wait forever.
			pw.Close()
			<-got
			rd.Release()
			t.Fatalf("%q: Next waits for input after the event's blank line", in)
		}
		if first.err != nil || first.ev != in {
			t.Errorf("%q: got %q, %v", in, first.ev, first.err)
		}
		pw.Close()
		if _, err := rd.Next(); err != io.EOF {
			t.Errorf("%q: then %v, want EOF", in, err)
		}
		rd.Release()
	}
}

// A read error met while waiting for the LF of an event's last CRLF does
// not take the event with it: the next call reports it.
func TestReaderErrorAfterEvent(t *testing.T) {
	boom := errors.New("connection reset")
	rd := NewReader(io.MultiReader(strings.NewReader("data: a\r\n\r"), iotest.ErrReader(boom)), 0)
	defer rd.Release()
	if ev, err := rd.Next(); err != nil || string(ev) != "data: a\r\n\r" {
		t.Fatalf("got %q, %v", ev, err)
	}
	if ev, err := rd.Next(); err != boom || len(ev) != 0 {
		t.Fatalf("then %q, %v; want %v", ev, err, boom)
	}
}

func TestData(t *testing.T) {
	for _, tc := range []struct{ ev, want string }{
		{"data: a\n\n", "a"},
		{"data:a\r\n\r\n", "a"},
		{"data: a\r\r", "a"},
		{"data: a\rdata:  b\r\r", "a\n b"},
		{"data: a\ndata: b\r\ndata: c\rdata: d\n\n", "a\nb\nc\nd"},
		{"event: x\r: comment\rdata: a\r\r", "a"},
		{"\ndata: a\r\r", "a"}, // an LF left over from the previous event's CRLF
		{"data\r\r", ""},       // a field name alone has an empty value
		{"data\rdata: b\r\r", "\nb"},
		{"datum: a\rdata2: b\r\r", ""},
		{"data: a", "a"},
	} {
		if got := Data([]byte(tc.ev)); string(got) != tc.want {
			t.Errorf("Data(%q) = %q, want %q", tc.ev, got, tc.want)
		}
	}
	ev := []byte("event: x\r\ndata: [DONE]\r\n\r\n")
	if a := testing.AllocsPerRun(10, func() { Data(ev) }); a != 0 {
		t.Errorf("one data line: %v allocations, want 0", a)
	}
}

// readEvents reads r to its end: the events, then what came with the final
// error.
func readEvents(r io.Reader, maxEvent int) (events []string, tail string, err error) {
	rd := NewReader(r, maxEvent)
	defer rd.Release()
	for {
		ev, err := rd.Next()
		if err != nil {
			return events, string(ev), err
		}
		events = append(events, string(ev))
	}
}

func equalEvents(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func showEvents(evs []string) string {
	var b strings.Builder
	for i, ev := range evs {
		if len(ev) > 60 {
			ev = fmt.Sprintf("%s...(%d bytes)...%s", ev[:20], len(ev), ev[len(ev)-20:])
		}
		fmt.Fprintf(&b, "  %d: %q\n", i, ev)
	}
	return b.String()
}

// cutPoints are offsets worth cutting a stream at: either side of every
// line-ending byte, and around multiples of the buffer size.
func cutPoints(in []byte) []int {
	seen := map[int]bool{}
	var at []int
	add := func(i int) {
		if i > 0 && i < len(in) && !seen[i] {
			seen[i] = true
			at = append(at, i)
		}
	}
	for i, c := range in {
		if c == '\r' || c == '\n' {
			add(i)
			add(i + 1)
		}
	}
	for k := 32 << 10; k < len(in)+2; k += 32 << 10 {
		add(k - 1)
		add(k)
		add(k + 1)
	}
	return at
}

// cutReader returns data in pieces, ending a Read at each cut offset.
type cutReader struct {
	data []byte
	cuts []int // ascending
	off  int
	// eofWithData returns io.EOF with the last piece, as some readers do.
	eofWithData bool
}

func (r *cutReader) Read(p []byte) (int, error) {
	if r.off >= len(r.data) {
		return 0, io.EOF
	}
	for len(r.cuts) > 0 && r.cuts[0] <= r.off {
		r.cuts = r.cuts[1:]
	}
	end := len(r.data)
	if len(r.cuts) > 0 {
		end = min(r.cuts[0], end)
	}
	n := copy(p, r.data[r.off:end])
	r.off += n
	if r.off == len(r.data) && r.eofWithData {
		return n, io.EOF
	}
	return n, nil
}

// specEventEnds is the SSE spec's framing written for clarity, not speed:
// split the whole stream into lines, each ending in CRLF, LF or CR (a CR at
// the very end included), and end an event after each blank line that
// follows a non-blank one. It returns where each event ends.
func specEventEnds(stream []byte) []int {
	var ends []int
	started := false
	for i := 0; i < len(stream); {
		j := i
		for j < len(stream) && stream[j] != '\r' && stream[j] != '\n' {
			j++
		}
		if j == len(stream) {
			break // a line cut by the stream's end
		}
		next := j + 1
		if stream[j] == '\r' && next < len(stream) && stream[next] == '\n' {
			next++
		}
		switch blank := j == i; {
		case !blank:
			started = true
		case started:
			ends = append(ends, next)
			started = false
		}
		i = next
	}
	return ends
}

// mayEndAtCR reports whether the Reader may return ev (an event as the spec
// frames it) without its final LF, leaving that LF to open the next event:
// when its blank line is a CRLF after a line that did not end in CRLF, and
// the CR is the last byte to have arrived. The reader waits for the LF only
// from a stream that has shown it ends lines in CRLF.
func mayEndAtCR(ev []byte) bool {
	return bytes.HasSuffix(ev, []byte("\r\n")) && !bytes.HasSuffix(ev[:len(ev)-2], []byte("\r\n"))
}

// checkAgainstSpec reads stream through r and holds what the Reader returns
// to specEventEnds: the same bytes, the same events, the same end.
func checkAgainstSpec(stream []byte, r io.Reader, maxEvent int) error {
	ends := specEventEnds(stream)
	rd := NewReader(r, maxEvent)
	defer rd.Release()
	off := 0 // bytes returned so far
	for k := 0; ; k++ {
		ev, err := rd.Next()
		if err == nil {
			end := off + len(ev)
			switch {
			case k >= len(ends):
				return fmt.Errorf("event %d %.60q: the spec ends only %d events", k, ev, len(ends))
			case end > len(stream) || !bytes.Equal(ev, stream[off:end]):
				return fmt.Errorf("event %d %.60q is not the stream's bytes at %d", k, ev, off)
			case end != ends[k] && !(end == ends[k]-1 && mayEndAtCR(stream[:ends[k]])):
				return fmt.Errorf("event %d %.60q ends at %d, the spec ends it at %d", k, ev, end, ends[k])
			case maxEvent > 0 && len(ev) > maxEvent:
				return fmt.Errorf("event %d is %d bytes, over the limit %d", k, len(ev), maxEvent)
			}
			off = end
			continue
		}
		// What the reader was reading when it stopped: the next event as
		// the spec frames it, or the rest of the stream.
		unit := len(stream)
		if k < len(ends) {
			unit = ends[k]
		}
		rest := stream[off:]
		switch {
		case errors.Is(err, ErrEventTooLarge):
			if maxEvent <= 0 || unit-off <= maxEvent {
				return fmt.Errorf("after %d events: too large, but what follows is %d bytes (limit %d)", k, unit-off, maxEvent)
			}
		case err == io.EOF:
			if k != len(ends) || len(bytes.TrimSpace(rest)) != 0 || len(ev) != 0 {
				return fmt.Errorf("EOF after %d of %d events, dropping %.60q", k, len(ends), rest)
			}
			if maxEvent > 0 && len(rest) > maxEvent {
				return fmt.Errorf("EOF dropping %d blank bytes over the limit %d", len(rest), maxEvent)
			}
		case err == io.ErrUnexpectedEOF:
			if k != len(ends) || !bytes.Equal(ev, rest) || len(bytes.TrimSpace(rest)) == 0 {
				return fmt.Errorf("cut after %d of %d events with %.60q, rest %.60q", k, len(ends), ev, rest)
			}
			if maxEvent > 0 && len(ev) > maxEvent {
				return fmt.Errorf("cut event of %d bytes over the limit %d", len(ev), maxEvent)
			}
		default:
			return fmt.Errorf("after %d events: %v", k, err)
		}
		return nil
	}
}
