package demo

// Structured outputs: a request that asks for a JSON schema gets, as its
// content, a JSON document generated from that schema, so that an SDK's
// structured-output helpers (openai-go's JSON decoding into a struct,
// Python's client.chat.completions.parse, Node's zodResponseFormat) accept
// it. The generator covers what those helpers emit: objects with
// properties and required, arrays with items and minItems, strings
// (with enum, const, a few formats and minLength), numbers and integers
// (with minimum/maximum), booleans, null, anyOf/oneOf/allOf (the first
// branch), nullable type lists, and $ref into $defs or definitions
// (pydantic puts nested models there).

import (
	"encoding/json"
	"strings"
)

// maxSchemaDepth bounds the nesting the generator follows, so a recursive
// schema ($ref to an ancestor) ends.
const maxSchemaDepth = 16

// responseFormat is the part of a chat request's response_format, or of a
// Responses request's text.format, that the fake reads. In chat the schema
// sits under json_schema.schema; in Responses, directly under schema.
type responseFormat struct {
	Type       string          `json:"type"`
	Schema     json.RawMessage `json:"schema"`
	JSONSchema *struct {
		Schema json.RawMessage `json:"schema"`
	} `json:"json_schema"`
}

// structuredContent returns the content a request asking for f gets, and
// false when f asks for plain text. said is what the user said, for the
// generated strings.
func structuredContent(f *responseFormat, said string) (string, bool) {
	if f == nil {
		return "", false
	}
	switch f.Type {
	case "json_object":
		b, _ := json.Marshal(map[string]string{"answer": simulatedSentence(said)})
		return string(b), true
	case "json_schema":
		raw := f.Schema
		if f.JSONSchema != nil && len(f.JSONSchema.Schema) > 0 {
			raw = f.JSONSchema.Schema
		}
		var schema map[string]any
		if json.Unmarshal(raw, &schema) != nil {
			schema = map[string]any{"type": "object"}
		}
		g := schemaGen{root: schema, said: firstRunes(said, saidRunes)}
		b, err := json.Marshal(g.value(schema, "", 0))
		if err != nil {
			return "{}", true
		}
		return string(b), true
	}
	return "", false
}

// schemaGen generates one document for the schema root.
type schemaGen struct {
	root map[string]any
	said string
}

// value is a value valid against s; name is the property it fills, which
// seeds the generated strings.
func (g schemaGen) value(s map[string]any, name string, depth int) any {
	if depth > maxSchemaDepth || s == nil {
		return nil
	}
	if ref, ok := s["$ref"].(string); ok {
		return g.value(g.resolve(ref), name, depth+1)
	}
	if c, ok := s["const"]; ok {
		return c
	}
	if enum, ok := s["enum"].([]any); ok && len(enum) > 0 {
		return enum[0]
	}
	for _, k := range []string{"anyOf", "oneOf", "allOf"} {
		if branches, ok := s[k].([]any); ok && len(branches) > 0 {
			if first := firstNonNull(branches); first != nil {
				return g.value(first, name, depth+1)
			}
			return nil
		}
	}
	switch schemaType(s) {
	case "object":
		return g.object(s, depth)
	case "array":
		return g.array(s, name, depth)
	case "string":
		return g.str(s, name)
	case "integer":
		return int64(number(s, 42))
	case "number":
		return number(s, 4.2)
	case "boolean":
		return true
	case "null":
		return nil
	}
	if _, ok := s["properties"]; ok {
		return g.object(s, depth)
	}
	return g.str(s, name)
}

func (g schemaGen) object(s map[string]any, depth int) map[string]any {
	out := map[string]any{}
	props, _ := s["properties"].(map[string]any)
	for k, v := range props {
		if ps, ok := v.(map[string]any); ok {
			out[k] = g.value(ps, k, depth+1)
		}
	}
	// A required property the schema does not describe still gets a value.
	if req, ok := s["required"].([]any); ok {
		for _, r := range req {
			if k, ok := r.(string); ok {
				if _, done := out[k]; !done {
					out[k] = g.said
				}
			}
		}
	}
	return out
}

func (g schemaGen) array(s map[string]any, name string, depth int) []any {
	n := 2
	if lo, ok := s["minItems"].(float64); ok && int(lo) > n {
		n = int(lo)
	}
	if hi, ok := s["maxItems"].(float64); ok && int(hi) < n {
		n = int(hi)
	}
	if depth >= maxSchemaDepth/2 {
		// Deep down (a recursive schema), arrays end the recursion.
		n = 0
	}
	items, _ := s["items"].(map[string]any)
	out := make([]any, 0, n)
	for range n {
		out = append(out, g.value(items, name, depth+1))
	}
	return out
}

func (g schemaGen) str(s map[string]any, name string) string {
	switch s["format"] {
	case "date-time":
		return "2025-01-02T03:04:05Z"
	case "date":
		return "2025-01-02"
	case "time":
		return "03:04:05"
	case "email":
		return "someone@example.com"
	case "uuid":
		return "123e4567-e89b-12d3-a456-426614174000"
	case "uri":
		return "https://example.com/"
	}
	v := name
	if v == "" {
		v = "value"
	}
	if g.said != "" {
		v += ": " + g.said
	}
	if lo, ok := s["minLength"].(float64); ok {
		for len([]rune(v)) < int(lo) {
			v += "."
		}
	}
	if hi, ok := s["maxLength"].(float64); ok && len([]rune(v)) > int(hi) {
		v = string([]rune(v)[:int(hi)])
	}
	return v
}

// resolve follows a local $ref ("#/$defs/Step", "#/definitions/Step", "#").
func (g schemaGen) resolve(ref string) map[string]any {
	path, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil
	}
	var cur any = g.root
	for part := range strings.SplitSeq(strings.TrimPrefix(path, "/"), "/") {
		if part == "" {
			continue
		}
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")]
	}
	m, _ := cur.(map[string]any)
	return m
}

// schemaType is s's type; of a list of types (["string","null"]), the
// first that is not null.
func schemaType(s map[string]any) string {
	switch t := s["type"].(type) {
	case string:
		return t
	case []any:
		for _, x := range t {
			if name, ok := x.(string); ok && name != "null" {
				return name
			}
		}
		return "null"
	}
	return ""
}

// firstNonNull is the first branch that is not {"type":"null"}, or the
// first branch if all are.
func firstNonNull(branches []any) map[string]any {
	var first map[string]any
	for _, b := range branches {
		m, ok := b.(map[string]any)
		if !ok {
			continue
		}
		if first == nil {
			first = m
		}
		if schemaType(m) != "null" {
			return m
		}
	}
	return first
}

// number is def moved into [minimum, maximum] (exclusive bounds taken as
// inclusive plus one).
func number(s map[string]any, def float64) float64 {
	v := def
	if lo, ok := s["minimum"].(float64); ok && v < lo {
		v = lo
	}
	if lo, ok := s["exclusiveMinimum"].(float64); ok && v <= lo {
		v = lo + 1
	}
	if hi, ok := s["maximum"].(float64); ok && v > hi {
		v = hi
	}
	if hi, ok := s["exclusiveMaximum"].(float64); ok && v >= hi {
		v = hi - 1
	}
	return v
}
