package demo_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/llmgate/llmgate/cmd/gateway/demo"
)

// recipe is what a structured-output client decodes the answer into.
type recipe struct {
	Title    string   `json:"title"`
	Servings int      `json:"servings"`
	Rating   float64  `json:"rating"`
	Vegan    bool     `json:"vegan"`
	Course   string   `json:"course"`
	Tags     []string `json:"tags"`
	Steps    []step   `json:"steps"`
	Author   *person  `json:"author"`
	Note     *string  `json:"note"`
}

type step struct {
	N    int    `json:"n"`
	Text string `json:"text"`
}

type person struct {
	Name  string `json:"name"`
	Email string `json:"email"`
}

// recipeSchema is recipe's schema the way SDK helpers write them: strict
// (every property required, no additional ones), a nested model under
// $defs (pydantic), a nullable $ref through anyOf, a type list with null,
// an enum and bounds.
const recipeSchema = `{
  "type": "object",
  "additionalProperties": false,
  "required": ["title","servings","rating","vegan","course","tags","steps","author","note"],
  "properties": {
    "title": {"type": "string", "minLength": 3},
    "servings": {"type": "integer", "minimum": 1, "maximum": 12},
    "rating": {"type": "number", "minimum": 0, "maximum": 5},
    "vegan": {"type": "boolean"},
    "course": {"type": "string", "enum": ["starter","main","dessert"]},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    "steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}},
    "author": {"anyOf": [{"$ref": "#/$defs/Person"}, {"type": "null"}]},
    "note": {"type": ["string", "null"]}
  },
  "$defs": {
    "Step": {"type": "object", "additionalProperties": false, "required": ["n","text"],
      "properties": {"n": {"type": "integer"}, "text": {"type": "string"}}},
    "Person": {"type": "object", "additionalProperties": false, "required": ["name","email"],
      "properties": {"name": {"type": "string"}, "email": {"type": "string", "format": "email"}}}
  }
}`

// decodeRecipe decodes content strictly and checks what the schema asks
// beyond the Go types.
func decodeRecipe(t *testing.T, content string) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(content)))
	dec.DisallowUnknownFields()
	var r recipe
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("content %s: %v", content, err)
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal([]byte(content), &all); err != nil || len(all) != 9 {
		t.Errorf("content has %d properties, want the 9 required: %s", len(all), content)
	}
	switch {
	case len(r.Title) < 3, r.Servings < 1 || r.Servings > 12, r.Rating < 0 || r.Rating > 5,
		r.Course != "starter" && r.Course != "main" && r.Course != "dessert",
		len(r.Tags) < 1, len(r.Steps) == 0, r.Steps[0].Text == "",
		r.Author == nil || r.Author.Email == "":
		t.Errorf("content does not satisfy the schema: %s", content)
	}
}

func schemaMap(t *testing.T) map[string]any {
	var m map[string]any
	if err := json.Unmarshal([]byte(recipeSchema), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestStructuredOutputChat(t *testing.T) {
	_, srv := start(t, demo.Options{ContentBytes: 4096}) // padding must not touch JSON
	c := sdk(srv)
	p := openai.ChatCompletionNewParams{
		Model:    "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("a soup")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "recipe", Schema: schemaMap(t), Strict: openai.Bool(true)},
		}},
	}
	res, err := c.Chat.Completions.New(testCtx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	decodeRecipe(t, res.Choices[0].Message.Content)

	// Streamed, the deltas add up to the same kind of document.
	s := c.Chat.Completions.NewStreaming(testCtx(t), p)
	var acc openai.ChatCompletionAccumulator
	for s.Next() {
		acc.AddChunk(s.Current())
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	decodeRecipe(t, acc.Choices[0].Message.Content)

	p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}
	res, err = c.Chat.Completions.New(testCtx(t), p)
	var obj map[string]any
	if err != nil || json.Unmarshal([]byte(res.Choices[0].Message.Content), &obj) != nil || len(obj) == 0 {
		t.Errorf("json_object: %v, content %q", err, res.Choices[0].Message.Content)
	}
}

func TestStructuredOutputResponses(t *testing.T) {
	_, srv := start(t, demo.Options{})
	c := sdk(srv)
	p := askParams("a soup")
	p.Text = responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigUnionParam{
		OfJSONSchema: &responses.ResponseFormatTextJSONSchemaConfigParam{Name: "recipe", Schema: schemaMap(t), Strict: openai.Bool(true)},
	}}
	res, err := c.Responses.New(testCtx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	decodeRecipe(t, res.OutputText())
	if format := res.Text.Format.Type; format != "json_schema" {
		t.Errorf("text.format not echoed: %s", res.JSON.Text.Raw())
	}
	events, err := streamed(t, c, p)
	if err != nil {
		t.Fatal(err)
	}
	decodeRecipe(t, events[len(events)-1].AsResponseCompleted().Response.OutputText())
}

// TestStructuredOutputRecursiveSchema: a schema that refers to itself
// still gets an answer, and it is JSON.
func TestStructuredOutputRecursiveSchema(t *testing.T) {
	_, srv := start(t, demo.Options{})
	p := askParams("a tree")
	p.Text = responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigUnionParam{
		OfJSONSchema: &responses.ResponseFormatTextJSONSchemaConfigParam{Name: "tree", Schema: map[string]any{
			"type": "object", "required": []any{"name", "children"},
			"properties": map[string]any{
				"name":     map[string]any{"type": "string"},
				"children": map[string]any{"type": "array", "items": map[string]any{"$ref": "#"}},
			},
		}},
	}}
	c := sdk(srv)
	res, err := c.Responses.New(testCtx(t), p)
	if err != nil || !json.Valid([]byte(res.OutputText())) {
		t.Fatalf("%v, content %q", err, res.OutputText())
	}
}
