package classify

// Why a hand-written walker: encoding/json validates the whole input with
// its byte-at-a-time state machine before decoding, and skips again every
// value a custom Unmarshaler receives; on a 1 KiB completion that was ~15µs
// and 11 allocations, on every 2xx answer and every stream event. This
// walker is as strict as json.Valid (FuzzFromCompletion holds it to that)
// and reads only the few fields classification needs, in ~1µs without
// allocating. Reading fields as it goes also lets parseErrorBody keep what
// a truncated error body said before the cut.

// maxDepth matches encoding/json's nesting limit.
const maxDepth = 10000

// walker is a strict, allocation-free JSON reader over b.
type walker struct {
	b     []byte
	i     int
	depth int
}

func (w *walker) ws() {
	for w.i < len(w.b) {
		switch w.b[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, 0 at the end.
func (w *walker) peek() byte {
	w.ws()
	if w.i < len(w.b) {
		return w.b[w.i]
	}
	return 0
}

// value consumes one value and returns its raw bytes.
func (w *walker) value() ([]byte, bool) {
	w.ws()
	start := w.i
	var ok bool
	switch w.peek() {
	case '"':
		ok = w.str()
	case '{':
		ok = w.object(nil)
	case '[':
		ok = w.array(nil)
	case 't':
		ok = w.lit("true")
	case 'f':
		ok = w.lit("false")
	case 'n':
		ok = w.lit("null")
	default:
		ok = w.number()
	}
	return w.b[start:w.i], ok
}

// skip consumes one value.
func (w *walker) skip() bool {
	_, ok := w.value()
	return ok
}

// object consumes an object, w at its '{'. For each member, field is
// called with w at the value, which it must consume; a nil field skips
// the values.
func (w *walker) object(field func(key []byte) bool) bool {
	w.i++ // '{'
	if w.depth++; w.depth > maxDepth {
		return false
	}
	if w.peek() == '}' {
		w.i++
		w.depth--
		return true
	}
	for {
		if w.peek() != '"' {
			return false
		}
		start := w.i + 1
		if !w.str() {
			return false
		}
		key := w.b[start : w.i-1]
		if w.peek() != ':' {
			return false
		}
		w.i++
		if field == nil {
			if !w.skip() {
				return false
			}
		} else if !field(key) {
			return false
		}
		switch w.peek() {
		case ',':
			w.i++
		case '}':
			w.i++
			w.depth--
			return true
		default:
			return false
		}
	}
}

// array consumes an array, w at its '['. For each element, elem is called
// with w at it, which it must consume; a nil elem skips them.
func (w *walker) array(elem func() bool) bool {
	w.i++ // '['
	if w.depth++; w.depth > maxDepth {
		return false
	}
	if w.peek() == ']' {
		w.i++
		w.depth--
		return true
	}
	for {
		if elem == nil {
			if !w.skip() {
				return false
			}
		} else if !elem() {
			return false
		}
		switch w.peek() {
		case ',':
			w.i++
		case ']':
			w.i++
			w.depth--
			return true
		default:
			return false
		}
	}
}

// str consumes a string, w at its '"'.
func (w *walker) str() bool {
	b := w.b
	i := w.i + 1
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			w.i = i + 1
			return true
		case c < 0x20:
			return false
		case c == '\\':
			if i+1 >= len(b) {
				return false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return false
				}
				for _, h := range b[i+2 : i+6] {
					if !isHex(h) {
						return false
					}
				}
				i += 6
			default:
				return false
			}
		default:
			i++
		}
	}
	return false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func (w *walker) lit(s string) bool {
	if len(w.b)-w.i < len(s) || string(w.b[w.i:w.i+len(s)]) != s {
		return false
	}
	w.i += len(s)
	return true
}

// number consumes -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (w *walker) number() bool {
	b, i := w.b, w.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return false
		}
		i = j
	}
	w.i = i
	return true
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// completionSummary is what a completion body, or one stream event, shows.
type completionSummary struct {
	choices   int
	filtered  bool   // finish_reason content_filter in some choice
	finished  bool   // some choice has a finish_reason (not null)
	generated bool   // some choice has output
	errObject []byte // the raw "error" value, when it is an object
}

// walkCompletion reads a completion body or stream event into s. It
// reports false when b is not a single, valid JSON object.
func walkCompletion(b []byte, s *completionSummary) bool {
	w := walker{b: b}
	if w.peek() != '{' {
		return false
	}
	output := func(key []byte) bool { // a member of "message" or "delta"
		switch string(key) {
		case "content", "tool_calls", "function_call", "refusal", "audio":
			raw, ok := w.value()
			s.generated = s.generated || nonEmpty(raw)
			return ok
		}
		return w.skip()
	}
	choice := func(key []byte) bool {
		switch string(key) {
		case "finish_reason":
			raw, ok := w.value()
			s.filtered = s.filtered || string(raw) == `"content_filter"`
			s.finished = s.finished || (ok && string(raw) != "null")
			return ok
		case "text": // legacy /v1/completions
			raw, ok := w.value()
			s.generated = s.generated || nonEmpty(raw)
			return ok
		case "message", "delta":
			if w.peek() == '{' {
				return w.object(output)
			}
		}
		return w.skip()
	}
	ok := w.object(func(key []byte) bool {
		switch string(key) {
		case "choices":
			if w.peek() == '[' {
				return w.array(func() bool {
					s.choices++
					if w.peek() == '{' {
						return w.object(choice)
					}
					return w.skip()
				})
			}
		case "error":
			if w.peek() == '{' {
				raw, ok := w.value()
				s.errObject = raw
				return ok
			}
		}
		return w.skip()
	})
	w.ws()
	return ok && w.i == len(b)
}
