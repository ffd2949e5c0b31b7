package fakeprovider

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
)

// AnthropicModels are the models the Anthropic fake lists (GET
// /v1/models) and describes (GET /v1/models/{id}) when no list is set,
// newest first as Anthropic lists them.
var AnthropicModels = []string{"claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1"}

// AnthropicModel is the fake's model object for id, with a vendor field
// (capabilities) a relay must keep.
func AnthropicModel(id string) string {
	return fmt.Sprintf(`{"type":"model","id":%q,"display_name":%q,"created_at":"2025-09-29T00:00:00Z","capabilities":{"batch":{"supported":true}}}`,
		id, strings.ToUpper(id[:1])+id[1:])
}

// anthropicFile is one file the fake holds.
type anthropicFile struct {
	meta    string
	content []byte
}

// serveObjects answers the Models and Files APIs as Anthropic does (the
// lists paged by limit and after_id), and reports whether path was one of
// theirs.
func (a *Anthropic) serveObjects(w http.ResponseWriter, r *http.Request, body []byte) bool {
	p := r.URL.Path
	switch {
	case p == "/v1/models" && r.Method == http.MethodGet:
		a.mu.Lock()
		ids, maxPage := a.models, a.maxPage
		a.mu.Unlock()
		if ids == nil {
			ids = AnthropicModels
		}
		items := make([]string, len(ids))
		for i, id := range ids {
			items[i] = AnthropicModel(id)
		}
		writeAnthropicList(w, r, ids, items, maxPage)
	case strings.HasPrefix(p, "/v1/models/") && r.Method == http.MethodGet:
		id := strings.TrimPrefix(p, "/v1/models/")
		writeAnthropicJSON(w, http.StatusOK, AnthropicModel(id))
	case p == "/v1/files" && r.Method == http.MethodPost:
		a.uploadFile(w, r, body)
	case p == "/v1/files" && r.Method == http.MethodGet:
		a.mu.Lock()
		ids, items := append([]string(nil), a.fileIDs...), make([]string, 0, len(a.fileIDs))
		for _, id := range ids {
			items = append(items, a.files[id].meta)
		}
		a.mu.Unlock()
		writeAnthropicList(w, r, ids, items, 0)
	case strings.HasPrefix(p, "/v1/files/"):
		a.serveFile(w, r)
	default:
		return false
	}
	return true
}

// uploadFile stores the multipart body's "file" part as file_<n>.
func (a *Anthropic) uploadFile(w http.ResponseWriter, r *http.Request, body []byte) {
	_, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	part, err := multipart.NewReader(strings.NewReader(string(body)), params["boundary"]).NextPart()
	if err != nil || part.FormName() != "file" {
		writeAnthropicError(w, AnthropicStep{Status: http.StatusBadRequest, ErrorType: "invalid_request_error", Message: "file: Field required"})
		return
	}
	content, _ := io.ReadAll(part)
	a.mu.Lock()
	if a.files == nil {
		a.files = map[string]anthropicFile{}
	}
	id := "file_fake" + strconv.Itoa(len(a.fileIDs)+1)
	meta := fmt.Sprintf(`{"id":%q,"type":"file","filename":%q,"mime_type":%q,"size_bytes":%d,"created_at":"2025-04-14T00:00:00Z","downloadable":false}`,
		id, part.FileName(), part.Header.Get("Content-Type"), len(content))
	a.files[id] = anthropicFile{meta: meta, content: content}
	a.fileIDs = append(a.fileIDs, id)
	a.mu.Unlock()
	writeAnthropicJSON(w, http.StatusOK, meta)
}

// serveFile answers GET /v1/files/{id}[/content] and DELETE /v1/files/{id}.
func (a *Anthropic) serveFile(w http.ResponseWriter, r *http.Request) {
	id, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/files/"), "/")
	a.mu.Lock()
	f, ok := a.files[id]
	if ok && r.Method == http.MethodDelete {
		delete(a.files, id)
		for i, fid := range a.fileIDs {
			if fid == id {
				a.fileIDs = append(a.fileIDs[:i], a.fileIDs[i+1:]...)
				break
			}
		}
	}
	a.mu.Unlock()
	switch {
	case !ok:
		writeAnthropicError(w, AnthropicStep{Status: http.StatusNotFound, ErrorType: "not_found_error", Message: "File not found: " + id})
	case r.Method == http.MethodDelete:
		writeAnthropicJSON(w, http.StatusOK, fmt.Sprintf(`{"id":%q,"type":"file_deleted"}`, id))
	case rest == "content":
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(f.content)
	default:
		writeAnthropicJSON(w, http.StatusOK, f.meta)
	}
}

// writeAnthropicList writes the page of items (ids[i] is items[i]'s id)
// that limit and after_id ask for, at most maxPage long (0: no bound), in
// Anthropic's list shape.
func writeAnthropicList(w http.ResponseWriter, r *http.Request, ids, items []string, maxPage int) {
	q := r.URL.Query()
	limit := 20
	if n, err := strconv.Atoi(q.Get("limit")); err == nil {
		limit = n
	}
	if maxPage > 0 {
		limit = min(limit, maxPage)
	}
	start := 0
	if after := q.Get("after_id"); after != "" {
		for i, id := range ids {
			if id == after {
				start = i + 1
			}
		}
	}
	end := min(start+limit, len(ids))
	first, last := "null", "null"
	if end > start {
		f, _ := json.Marshal(ids[start])
		l, _ := json.Marshal(ids[end-1])
		first, last = string(f), string(l)
	}
	writeAnthropicJSON(w, http.StatusOK, fmt.Sprintf(`{"data":[%s],"has_more":%t,"first_id":%s,"last_id":%s}`,
		strings.Join(items[start:end], ","), end < len(ids), first, last))
}

func writeAnthropicJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}
