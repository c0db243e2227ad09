package api_test

// The spec test. It keeps api/openapi.yaml and the server in step:
//
//   - TestSpecIsValidOpenAPI31 loads the document with kin-openapi and
//     validates it (structure, references, examples against their schemas).
//   - TestSpecCoversEveryRoute compares the node's routes with the
//     document's operations, both ways. A route added to the node without an
//     operation here fails with a message saying what to add.
//   - TestErrorCodesAreListed compares the ErrorCode enum with the Code*
//     constants of the node and of the Go client.
//   - TestSpecAgainstRealNode sends the API guide's examples, every call of the
//     Go client and a set of bad requests through a validating proxy to a
//     real node: each request and each answer is validated against the
//     document (answers strictly: a field the document does not list fails),
//     and every operation must have answered 2xx at least once.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/client"
	"github.com/fairshard/fairshard/internal/testnode"
	"github.com/fairshard/fairshard/node"
)

// httpClient sends the tests' raw requests; TestMain closes its idle
// connections before looking for leaked goroutines.
var httpClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: 30 * time.Second}

func TestMain(m *testing.M) { testnode.Main(m, httpClient.CloseIdleConnections) }

// notDescribed lists public routes the node serves that are deliberately
// not operations of api/openapi.yaml, each with the reason. Node-to-node
// routes (/internal/…) are never described and need no entry.
var notDescribed = map[string]string{
	"GET /v1/rows": "answers 404 only, pointing the caller at GET /v1/rows/{dispatch_key}",
	"GET /ui/":     "the web console's static files (HTML, CSS, JavaScript), not an API; docs/api.md \"Console\"",
	"GET /ui":      "redirects to /ui/",
}

// howToAdd ends every route mismatch message.
const howToAdd = `Describe it in api/openapi.yaml under "paths:" (parameters, request body schema,
every answer's schema, error responses: copy a neighbouring operation), then run
go test ./api/ (it validates real answers against what you wrote). If the route is
not part of the public API, add it to notDescribed in api/openapi_test.go with the
reason instead.`

func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData([]byte(api.OpenAPIYAML()))
	if err != nil {
		t.Fatalf("api/openapi.yaml does not load: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("api/openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	return doc
}

func TestSpecIsValidOpenAPI31(t *testing.T) {
	doc := loadSpec(t)
	if !doc.IsOpenAPI31OrLater() || !strings.HasPrefix(doc.OpenAPI, "3.1.") {
		t.Fatalf("openapi: %q, want 3.1.x", doc.OpenAPI)
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.OperationID == "" || op.Summary == "" {
				t.Errorf("%s %s: every operation needs an operationId and a summary", method, path)
			}
		}
	}
}

// ---- a real node ----

// startNode starts an in-process test node (testnode.Config in a fresh
// data dir) and closes it at cleanup.
func startNode(t *testing.T, mutate func(*node.Config)) *node.Node {
	t.Helper()
	cfg := testnode.Config(t.TempDir())
	if mutate != nil {
		mutate(&cfg)
	}
	return testnode.Start(t, cfg).Node
}

// normalise turns a ServeMux pattern ("GET /v1/rows/{key...}") or a spec
// operation (GET, "/v1/rows/{dispatch_key}") into "GET /v1/rows/{}".
func normalise(method, path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
			segs[i] = "{}"
		}
	}
	method = cmp.Or(method, "ANY")
	return strings.ToUpper(method) + " " + strings.Join(segs, "/")
}

func TestSpecCoversEveryRoute(t *testing.T) {
	doc := loadSpec(t)
	n := startNode(t, nil)

	served := map[string]string{} // normalised → pattern
	for _, pattern := range n.Routes() {
		method, path, ok := strings.Cut(pattern, " ")
		if !ok {
			method, path = "", pattern
		}
		if strings.HasPrefix(path, "/internal/") {
			continue
		}
		if _, skip := notDescribed[pattern]; skip {
			continue
		}
		served[normalise(method, path)] = pattern
	}
	if len(served) < 10 {
		t.Fatalf("the node lists only %d public routes (%v): has node.(*Node).Routes stopped recording them?", len(served), n.Routes())
	}
	described := map[string]string{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			described[normalise(method, path)] = method + " " + path
		}
	}
	for _, key := range sortedKeys(served) {
		if _, ok := described[key]; !ok {
			t.Errorf("the node serves %q (node/http.go) but api/openapi.yaml does not describe it.\n%s", served[key], howToAdd)
		}
	}
	for _, key := range sortedKeys(described) {
		if _, ok := served[key]; !ok {
			t.Errorf("api/openapi.yaml describes %s, but the node serves no such route: remove the operation from the spec, or register the route in node/http.go", described[key])
		}
	}
	for pattern := range notDescribed {
		if !slices.Contains(n.Routes(), pattern) {
			t.Errorf("notDescribed lists %q, which the node no longer serves: remove the entry", pattern)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// codeConstants returns the string constants named Code* declared in the
// non-test Go files of dir.
// aliasPrefix marks, in codeConstants' result, a constant defined as
// package api's constant of the name that follows.
const aliasPrefix = "api."

// codeConstants returns the Code* string constants declared in dir's
// non-test files: name → value, or aliasPrefix + the name of package
// api's constant it is defined as.
func codeConstants(t *testing.T, dir string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	out := map[string]string{}
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, "Code") || i >= len(vs.Values) {
						continue
					}
					switch v := vs.Values[i].(type) {
					case *ast.BasicLit:
						if v.Kind == token.STRING {
							out[name.Name], _ = strconv.Unquote(v.Value)
						}
					case *ast.SelectorExpr: // api.CodeX: package api's value
						if x, ok := v.X.(*ast.Ident); ok && x.Name == "api" {
							out[name.Name] = aliasPrefix + v.Sel.Name
						}
					}
				}
			}
		}
	}
	return out
}

func TestErrorCodesAreListed(t *testing.T) {
	doc := loadSpec(t)
	var enum []string
	for _, v := range doc.Components.Schemas["ErrorCode"].Value.Enum {
		enum = append(enum, v.(string))
	}
	slices.Sort(enum)
	desc := doc.Components.Schemas["ErrorCode"].Value.Description
	for _, code := range enum {
		if !strings.Contains(desc, "`"+code+"`") {
			t.Errorf("ErrorCode's description in api/openapi.yaml does not explain %q: add a row to its table", code)
		}
	}
	own := codeConstants(t, ".") // the server answers with these; the client aliases them
	for _, dir := range []string{".", "../client"} {
		consts := codeConstants(t, dir)
		if len(consts) == 0 {
			t.Fatalf("found no Code* constants in %s: the API's error codes moved? Point this test at them", dir)
		}
		var codes []string
		for name, v := range consts {
			if alias, ok := strings.CutPrefix(v, aliasPrefix); ok {
				if v, ok = own[alias]; !ok {
					t.Errorf("%s declares %s = api.%s, which package api does not declare", dir, name, alias)
					continue
				}
			}
			codes = append(codes, v)
			if !slices.Contains(enum, v) {
				t.Errorf("%s declares %s = %q, which api/openapi.yaml does not list: add it to components.schemas.ErrorCode (enum and table)", dir, name, v)
			}
		}
		for _, v := range enum {
			if !slices.Contains(codes, v) {
				t.Errorf("api/openapi.yaml lists error code %q, which %s does not declare (a Code* constant)", v, dir)
			}
		}
	}
}

// ---- the validating proxy ----

// validator sits between a caller and a real node: it validates each
// request and each answer against the document, records what failed and
// which operations answered which statuses, and forwards unchanged.
type validator struct {
	doc    *openapi3.T
	target string // node base URL
	opts   *openapi3filter.Options

	mu       sync.Mutex
	problems []string
	answered map[string]map[int]bool // operationId → statuses validated
	codes    map[string]bool         // error codes seen in validated answers
}

// headerInvalid marks a request the test sends knowing it is invalid: only
// the answer is validated.
const headerInvalid = "X-Spec-Test-Invalid"

// headerForwardHost asks the proxy to forward a request with this Host
// (what a page reaching the node through DNS rebinding sends).
const headerForwardHost = "X-Spec-Test-Host"

func newValidator(t *testing.T, doc *openapi3.T, target string) (*validator, *httptest.Server) {
	v := &validator{doc: doc, target: target, answered: map[string]map[int]bool{}, codes: map[string]bool{},
		opts: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true, MultiError: true}}
	srv := httptest.NewServer(v)
	t.Cleanup(srv.Close)
	return v, srv
}

func (v *validator) problem(format string, args ...any) {
	v.mu.Lock()
	v.problems = append(v.problems, fmt.Sprintf(format, args...))
	v.mu.Unlock()
}

// find returns the operation of a request, matching the escaped path
// segment by segment (literal segments first), and its path parameters
// (unescaped). op is nil when the path matches but the method does not.
func (v *validator) find(method, escapedPath string) (route *routers.Route, params map[string]string, pathFound bool) {
	segs := strings.Split(escapedPath, "/")
	bestLiterals := -1
	for tmpl, item := range v.doc.Paths.Map() {
		tsegs := strings.Split(tmpl, "/")
		if len(tsegs) != len(segs) {
			continue
		}
		p := map[string]string{}
		literals := 0
		ok := true
		for i, ts := range tsegs {
			if strings.HasPrefix(ts, "{") && strings.HasSuffix(ts, "}") {
				val, err := url.PathUnescape(segs[i])
				if err != nil || val == "" {
					ok = false
					break
				}
				p[ts[1:len(ts)-1]] = val
				continue
			}
			if ts != segs[i] {
				ok = false
				break
			}
			literals++
		}
		if !ok || literals <= bestLiterals {
			continue
		}
		bestLiterals, pathFound = literals, true
		route, params = nil, nil
		if op := item.GetOperation(method); op != nil {
			route = &routers.Route{Spec: v.doc, Path: tmpl, PathItem: item, Method: method, Operation: op}
			params = p
		}
	}
	return route, params, pathFound
}

func (v *validator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	body, _ := io.ReadAll(r.Body)
	invalid := r.Header.Get(headerInvalid) != ""
	r.Header.Del(headerInvalid)
	forwardHost := r.Header.Get(headerForwardHost)
	r.Header.Del(headerForwardHost)
	what := r.Method + " " + r.URL.RequestURI()
	route, params, pathFound := v.find(r.Method, r.URL.EscapedPath())
	var reqIn *openapi3filter.RequestValidationInput
	if route != nil {
		r.Body = io.NopCloser(bytes.NewReader(body))
		reqIn = &openapi3filter.RequestValidationInput{Request: r, PathParams: params, Route: route, Options: v.opts}
		if !invalid {
			if err := openapi3filter.ValidateRequest(ctx, reqIn); err != nil {
				v.problem("request %s (body %.300s) does not match api/openapi.yaml: %v\n"+
					"If the request is right (the node takes it), describe it in api/openapi.yaml.", what, body, err)
			}
		}
	} else if !invalid {
		v.problem("request %s: api/openapi.yaml has no operation for it (path described: %v)", what, pathFound)
	}

	fwd, err := http.NewRequestWithContext(ctx, r.Method, v.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	fwd.Header = r.Header.Clone()
	if forwardHost != "" {
		fwd.Host = forwardHost
	}
	if len(body) == 0 {
		fwd.Body, fwd.ContentLength = http.NoBody, 0
	}
	resp, err := httpClient.Do(fwd)
	if err != nil {
		v.problem("%s: forward to the node: %v", what, err)
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	if route != nil {
		respIn := &openapi3filter.ResponseValidationInput{RequestValidationInput: reqIn, Status: resp.StatusCode,
			Header: resp.Header, Options: v.opts}
		respIn.SetBodyBytes(data)
		if err := openapi3filter.ValidateResponse(ctx, respIn); err != nil {
			v.problem("answer to %s (HTTP %d, body %.400s) does not match api/openapi.yaml: %v\n"+
				"If the node is right (a new field, status or error code), describe it in api/openapi.yaml: every answer field must be listed there.",
				what, resp.StatusCode, data, err)
		} else {
			v.mu.Lock()
			if v.answered[route.Operation.OperationID] == nil {
				v.answered[route.Operation.OperationID] = map[int]bool{}
			}
			v.answered[route.Operation.OperationID][resp.StatusCode] = true
			v.mu.Unlock()
		}
	} else if err := v.validateSchema("ErrorResponse", data); err != nil {
		// Unknown paths and methods answer the API's JSON error.
		v.problem("answer to %s (HTTP %d, body %.300s) is not an ErrorResponse: %v", what, resp.StatusCode, data, err)
	}
	if resp.StatusCode/100 != 2 {
		var env struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(data, &env) == nil && env.Error.Code != "" {
			v.mu.Lock()
			v.codes[env.Error.Code] = true
			v.mu.Unlock()
		}
	}
	for k, vals := range resp.Header {
		w.Header()[k] = vals
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(data)
}

// validateSchema validates JSON data against a component schema.
func (v *validator) validateSchema(name string, data []byte) error {
	var val any
	if err := json.Unmarshal(data, &val); err != nil {
		return err
	}
	return v.doc.Components.Schemas[name].Value.VisitJSON(val, openapi3.EnableJSONSchema2020())
}

// strictAnswers makes every object schema of doc that lists properties and
// says nothing of others refuse other properties, so an answer carrying a
// field the document does not describe fails validation. (The document
// itself stays open for answers: clients must tolerate new fields.)
func strictAnswers(doc *openapi3.T) {
	seen := map[*openapi3.Schema]bool{}
	var walk func(*openapi3.SchemaRef)
	walk = func(s *openapi3.SchemaRef) {
		if s == nil || s.Value == nil || seen[s.Value] {
			return
		}
		seen[s.Value] = true
		v := s.Value
		if len(v.Properties) > 0 && v.AdditionalProperties.Has == nil && v.AdditionalProperties.Schema == nil {
			no := false
			v.AdditionalProperties.Has = &no
		}
		for _, p := range v.Properties {
			walk(p)
		}
		walk(v.Items)
		for _, list := range [][]*openapi3.SchemaRef{v.AnyOf, v.OneOf, v.AllOf} {
			for _, s := range list {
				walk(s)
			}
		}
	}
	for _, s := range doc.Components.Schemas {
		walk(s)
	}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			for _, resp := range op.Responses.Map() {
				if resp.Value == nil {
					continue
				}
				for _, mt := range resp.Value.Content {
					walk(mt.Schema)
				}
			}
		}
	}
}

// ---- API guide examples ----

// apiGuide is the API guide whose curl examples the test runs.
const apiGuide = "../docs/api.md"

// example is one curl command of the API guide (docs/api.md).
type example struct {
	line         int
	method, url  string
	body         string
	hasBody      bool
	header       http.Header // the -H headers, sent as given
	responseJSON string      // the example answer written under it, if any
}

// guideExamples extracts the curl commands of the API guide,
// docs/api.md: every ```sh code block of the file, with the JSON answer
// written as comment lines right under a command.
func guideExamples(t *testing.T) []example {
	t.Helper()
	data, err := os.ReadFile(apiGuide)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var out []example
	inCode := false
	var block []string
	blockStart := 0
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "```sh") && !inCode:
			inCode, block, blockStart = true, nil, i+2
		case strings.HasPrefix(l, "```") && inCode:
			inCode = false
			out = append(out, parseShell(t, block, blockStart)...)
		case inCode:
			block = append(block, l)
		}
	}
	return out
}

// parseShell splits a shell block into curl commands: words with single
// and double quotes, backslash-newline continuations, ';' and newlines
// ending commands, '#' comments.
func parseShell(t *testing.T, block []string, firstLine int) []example {
	t.Helper()
	src := strings.Join(block, "\n") + "\n"
	var out []example
	var words []string
	var word strings.Builder
	inWord := false
	line := firstLine
	cmdLine := firstLine
	var pendingComment []string
	endWord := func() {
		if inWord {
			words = append(words, word.String())
			word.Reset()
			inWord = false
		}
	}
	endCmd := func() {
		endWord()
		if len(words) > 0 {
			if words[0] == "curl" {
				out = append(out, curlExample(t, words, cmdLine))
			}
			words = nil
		}
	}
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '\\' && i+1 < len(src) && src[i+1] == '\n':
			i++
			line++
		case c == '\'':
			inWord = true
			j := strings.IndexByte(src[i+1:], '\'')
			if j < 0 {
				t.Fatalf("%s line %d: unterminated quote", apiGuide, line)
			}
			word.WriteString(src[i+1 : i+1+j])
			line += strings.Count(src[i+1:i+1+j], "\n")
			i += j + 1
		case c == '"':
			inWord = true
			for i++; i < len(src) && src[i] != '"'; i++ {
				if src[i] == '\\' && i+1 < len(src) {
					i++
				}
				word.WriteByte(src[i])
			}
		case c == '#' && !inWord:
			j := strings.IndexByte(src[i:], '\n')
			comment := src[i+1 : i+j]
			fullLine := len(words) == 0
			if fullLine {
				pendingComment = append(pendingComment, comment)
			}
			i += j - 1
		case c == '\n' || c == ';':
			endCmd()
			if c == '\n' {
				line++
				if i+1 < len(src) && !strings.HasPrefix(strings.TrimLeft(src[i+1:], " "), "#") && len(pendingComment) > 0 {
					attachAnswer(out, pendingComment)
					pendingComment = nil
				}
			}
			if len(words) == 0 {
				cmdLine = line
			}
		case c == ' ' || c == '\t':
			endWord()
		default:
			inWord = true
			word.WriteByte(c)
		}
	}
	endCmd()
	if len(pendingComment) > 0 {
		attachAnswer(out, pendingComment)
	}
	return out
}

// attachAnswer gives the last example the JSON of the comment lines under
// it, when they form one JSON value.
func attachAnswer(out []example, comment []string) {
	if len(out) == 0 {
		return
	}
	text := strings.TrimSpace(strings.Join(comment, "\n"))
	if strings.HasPrefix(text, "{") && json.Valid([]byte(text)) {
		out[len(out)-1].responseJSON = text
	}
}

func curlExample(t *testing.T, words []string, line int) example {
	t.Helper()
	ex := example{line: line, header: http.Header{}}
	for i := 1; i < len(words); i++ {
		w := words[i]
		switch {
		case w == "-s" || w == "-f" || w == "-fs":
		case w == "-H" || w == "--header":
			i++
			name, value, ok := strings.Cut(words[i], ":")
			if !ok {
				t.Fatalf("%s line %d: header %q is not \"Name: value\"", apiGuide, line, words[i])
			}
			ex.header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		case strings.HasPrefix(w, "-X") && len(w) > 2:
			ex.method = w[2:]
		case w == "-X":
			i++
			ex.method = words[i]
		case w == "-d" || w == "--data":
			i++
			ex.body, ex.hasBody = words[i], true
		case strings.HasPrefix(w, "-"):
			t.Fatalf("%s line %d: curl option %s is not understood by this test; teach curlExample", apiGuide, line, w)
		default:
			ex.url = w
		}
	}
	if ex.method == "" {
		ex.method = http.MethodGet
		if ex.hasBody {
			ex.method = http.MethodPost
		}
	}
	if !strings.Contains(ex.url, "://") {
		ex.url = "http://" + ex.url
	}
	return ex
}

// ---- the real-node test ----

func TestSpecAgainstRealNode(t *testing.T) {
	doc := loadSpec(t)
	strictAnswers(doc)
	if err := (&validator{doc: doc}).validateSchema("Health", []byte(`{"status":"ok","undocumented":1}`)); err == nil {
		t.Fatal("the strict answer check lets an undocumented field through: strictAnswers is broken")
	}

	// A target that takes everything, except task queue "fail" (422: a
	// dead letter at once).
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/fail") {
			http.Error(w, "refused by the test target", http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer target.Close()
	targetURL := target.URL + "/deliver/{namespace}/{task_queue}"
	n := startNode(t, func(c *node.Config) { c.DefaultTarget = targetURL })
	v, proxy := newValidator(t, doc, "http://"+n.APIAddr())

	t.Run("API guide examples", func(t *testing.T) {
		examples := guideExamples(t)
		if len(examples) < 15 {
			t.Fatalf("found %d curl examples in %s; the parser lost them?", len(examples), apiGuide)
		}
		answers := 0
		for _, ex := range examples {
			if ex.responseJSON != "" {
				answers++
			}
			checkGuideExample(t, v, proxy.URL, targetURL, ex)
		}
		if answers == 0 {
			t.Errorf("no example answer (JSON comment lines under a curl command) found in %s; the parser lost it?", apiGuide)
		}
		t.Logf("%d examples in %s, %d with a written answer", len(examples), apiGuide, answers)
	})

	t.Run("client calls", func(t *testing.T) { clientWalkthrough(t, proxy.URL) })

	t.Run("error answers", func(t *testing.T) {
		tokenNode := startNode(t, func(c *node.Config) { c.APIToken = "s3cret" })
		tv, tproxy := newValidator(t, doc, "http://"+tokenNode.APIAddr())
		status, _ := send(t, tproxy.URL, http.MethodGet, "/v1/cluster", "", false)
		if status != http.StatusUnauthorized {
			t.Errorf("GET /v1/cluster without the token: HTTP %d, want 401", status)
		}
		tv.mu.Lock()
		v.problems = append(v.problems, tv.problems...)
		for c := range tv.codes {
			v.codes[c] = true
		}
		tv.mu.Unlock()

		// A cluster capped at one held workflow: the second hold is 409.
		capped := startNode(t, func(c *node.Config) { c.MaxHolds = 1 })
		cv, cproxy := newValidator(t, doc, "http://"+capped.APIAddr())
		send(t, cproxy.URL, http.MethodPut, "/v1/workflows/wf-a/hold", "", false)
		if status, body := send(t, cproxy.URL, http.MethodPut, "/v1/workflows/wf-b/hold", "", false); status != http.StatusConflict {
			t.Errorf("a hold past --max-holds 1: HTTP %d, want 409: %s", status, body)
		}
		cv.mu.Lock()
		v.problems = append(v.problems, cv.problems...)
		for c := range cv.codes {
			v.codes[c] = true
		}
		cv.mu.Unlock()

		// A lone node told to make every row durable on 2 replicas: 503.
		lone := startNode(t, func(c *node.Config) { c.Replication.WriteCopies = 2 })
		lv, lproxy := newValidator(t, doc, "http://"+lone.APIAddr())
		if status, body := send(t, lproxy.URL, http.MethodPost, "/v1/rows", `{"rows":[{"dispatch_key":"k1"}]}`, false); status != http.StatusServiceUnavailable {
			t.Errorf("an append to a lone node with --write-copies 2: HTTP %d, want 503: %s", status, body)
		}
		lv.mu.Lock()
		v.problems = append(v.problems, lv.problems...)
		for c := range lv.codes {
			v.codes[c] = true
		}
		lv.mu.Unlock()

		rows := make([]string, 1001)
		for i := range rows {
			rows[i] = fmt.Sprintf(`{"dispatch_key":"big-%d"}`, i)
		}
		for _, c := range []struct {
			method, path, body string
			want               int
		}{
			{http.MethodPost, "/v1/rows", `{"rows":[`, 400},
			{http.MethodPost, "/v1/rows", `{"rows":[{"dispatch_key":"k","colour":"red"}]}`, 400},
			{http.MethodPost, "/v1/rows", `{"rows":[{"dispatch_key":"k","namespace":"bad name"}]}`, 400},
			{http.MethodPost, "/v1/rows", `{"rows":[` + strings.Join(rows, ",") + `]}`, 413},
			{http.MethodGet, "/v1/rows/no-such-row", "", 404},
			{http.MethodGet, "/v1/rows/" + strings.Repeat("k", 513), "", 400},
			{http.MethodGet, "/v1/namespaces/bad%20name", "", 400},
			{http.MethodPut, "/v1/namespaces/acme", `{"max_in_flight":-1}`, 400},
			{http.MethodPut, "/v1/namespaces/acme", `{"quota":1}`, 400},
			{http.MethodPut, "/v1/namespaces/acme/task-queues/mail/target", `{"url":"ftp://x"}`, 400},
			{http.MethodGet, "/v1/namespaces/acme/dead-letters?limit=0", "", 400},
			{http.MethodPost, "/v1/namespaces/acme/dead-letters/redrive", `{"keys":[""]}`, 400},
			{http.MethodPut, "/v1/workflows/" + strings.Repeat("w", 200) + "/hold", "", 400},
			{http.MethodDelete, "/v1/cluster", "", 405},
			{http.MethodGet, "/v1/no-such-endpoint", "", 404},
		} {
			if status, body := send(t, proxy.URL, c.method, c.path, c.body, true); status != c.want {
				t.Errorf("%s %.80s: HTTP %d, want %d: %.300s", c.method, c.path, status, c.want, body)
			}
		}
		// What a web page makes a browser send (docs/operations.md
		// "Security"): a form-typed write, a cross-site one, a rebound Host.
		for _, c := range []struct {
			name   string
			header http.Header
			want   int
		}{
			{"text/plain", http.Header{"Content-Type": {"text/plain"}}, 415},
			{"cross-site", http.Header{"Content-Type": {"application/json"}, "Origin": {"http://evil.example"}}, 403},
			{"rebound Host", http.Header{"Content-Type": {"application/json"}, headerForwardHost: {"evil.example"}}, 421},
		} {
			if status, body := sendWith(t, proxy.URL, http.MethodPost, "/v1/rows", `{"rows":[{"dispatch_key":"page-1"}]}`, true, c.header); status != c.want {
				t.Errorf("POST /v1/rows, %s: HTTP %d, want %d: %.300s", c.name, status, c.want, body)
			}
		}
	})

	t.Run("served document", func(t *testing.T) {
		status, body := send(t, proxy.URL, http.MethodGet, "/v1/openapi.yaml", "", false)
		if status != http.StatusOK || body != api.OpenAPIYAML() {
			t.Errorf("GET /v1/openapi.yaml: HTTP %d, %d bytes; want 200 and the embedded document (%d bytes)", status, len(body), len(api.OpenAPIYAML()))
		}
	})

	v.mu.Lock()
	defer v.mu.Unlock()
	for _, p := range v.problems {
		t.Error(p)
	}
	// Every operation answered 2xx at least once and was validated.
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			ok := false
			for status := range v.answered[op.OperationID] {
				ok = ok || status/100 == 2
			}
			if !ok {
				t.Errorf("no validated 2xx answer of %s %s (%s): call it in the examples of docs/api.md or in clientWalkthrough (api/openapi_test.go)", method, path, op.OperationID)
			}
		}
	}
	// Every error code was answered and validated, except those a healthy
	// node cannot be made to answer from outside.
	for _, code := range doc.Components.Schemas["ErrorCode"].Value.Enum {
		c := code.(string)
		if c == client.CodeUnavailable || c == client.CodeInternal {
			continue
		}
		if !v.codes[c] {
			t.Errorf("no validated answer carried error code %q: add a bad request that causes it to the \"error answers\" cases", c)
		}
	}
}

// send sends one raw request through the proxy; invalid marks a request
// that is meant not to match the document (only its answer is checked).
func send(t *testing.T, base, method, path, body string, invalid bool) (int, string) {
	t.Helper()
	h := http.Header{}
	if body != "" || (method != http.MethodGet && method != http.MethodHead) {
		h.Set("Content-Type", "application/json") // every write, body or not
	}
	return sendWith(t, base, method, path, body, invalid, h)
}

// sendWith is send with exactly the headers given.
func sendWith(t *testing.T, base, method, path, body string, invalid bool, header http.Header) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if invalid {
		req.Header.Set(headerInvalid, "1")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// checkGuideExample validates an API guide example's request (and the answer
// written under it) offline, then sends it through the validating proxy
// (target URLs in its body pointed at the local test target, so nothing
// leaves the machine) and requires a 2xx answer.
func checkGuideExample(t *testing.T, v *validator, proxyURL, targetURL string, ex example) {
	t.Helper()
	u, err := url.Parse(ex.url)
	if err != nil {
		t.Fatalf("%s line %d: %v", apiGuide, ex.line, err)
	}
	where := fmt.Sprintf("%s line %d (%s %s)", apiGuide, ex.line, ex.method, u.RequestURI())
	route, params, _ := v.find(ex.method, u.EscapedPath())
	if route == nil {
		t.Errorf("%s: api/openapi.yaml has no operation for it", where)
		return
	}
	var body io.Reader
	if ex.hasBody {
		body = strings.NewReader(ex.body)
	}
	req := httptest.NewRequest(ex.method, u.RequestURI(), body)
	for k, v := range ex.header {
		req.Header[k] = v
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: v.opts}
	if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
		t.Errorf("%s: the example request does not match api/openapi.yaml: %v", where, err)
	}
	if ex.responseJSON != "" {
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: http.StatusOK,
			Header: http.Header{"Content-Type": {"application/json"}}, Options: v.opts}
		out.SetBodyBytes([]byte(ex.responseJSON))
		if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
			t.Errorf("%s: the example answer written under it does not match api/openapi.yaml: %v", where, err)
		}
	}
	sent := ex.body
	if ex.hasBody {
		var m map[string]any
		if json.Unmarshal([]byte(sent), &m) == nil {
			if _, ok := m["url"]; ok {
				m["url"] = targetURL
				b, _ := json.Marshal(m)
				sent = string(b)
			}
		}
	}
	// Sent with the example's own headers: an example missing one the
	// node requires (Content-Type on a write) fails here as it would for
	// a reader.
	status, answer := sendWith(t, proxyURL, ex.method, u.RequestURI(), sent, false, ex.header)
	if status/100 != 2 {
		t.Errorf("%s: HTTP %d: %.300s", where, status, answer)
	}
}

// clientWalkthrough calls every method of the Go client through the
// validating proxy and checks what each returns.
func clientWalkthrough(t *testing.T, proxyURL string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(client.Options{Nodes: []string{proxyURL}, Retry: client.RetryConfig{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	res, err := c.Append(ctx,
		client.Row{DispatchKey: "walk-1", Namespace: "walk", TaskQueue: "q", ActivityType: "send", Payload: json.RawMessage(`{"n":1}`)},
		// Held back an hour, so Get below reads it pending: a delivered row
		// keeps no payload (a slim tombstone).
		client.Row{WorkflowID: "walk-wf", Ordinal: 0, Namespace: "walk", PayloadBytes: []byte{0, 1, 2}, ContentType: "application/x-test", Delay: time.Hour + 1500*time.Microsecond},
		client.Row{DispatchKey: "walk-dead-1", Namespace: "walk-dl", TaskQueue: "fail"},
		client.Row{DispatchKey: "walk-dead-2", Namespace: "walk-dl", TaskQueue: "fail"},
		client.Row{DispatchKey: "walk-dead-3", Namespace: "walk-dl", TaskQueue: "fail"},
	)
	must("Append", err)
	if len(res) != 5 || res[0].Status != client.Created || res[1].DispatchKey != "walk-wf:0" {
		t.Fatalf("Append results %+v", res)
	}
	res, err = c.Append(ctx, client.Row{DispatchKey: "walk-1", Namespace: "walk"})
	must("Append again", err)
	if res[0].Status != client.Duplicate {
		t.Errorf("second append of walk-1: %s, want duplicate", res[0].Status)
	}
	row, err := c.Get(ctx, "walk-wf:0")
	must("Get", err)
	if !bytes.Equal(row.Payload, []byte{0, 1, 2}) || row.ContentType != "application/x-test" || row.Namespace != "walk" {
		t.Errorf("Get(walk-wf:0) = %+v", row)
	}
	if _, err := c.Append(ctx, client.Row{DispatchKey: "walk/a key?with#odd:chars"}); err != nil {
		t.Fatal(err)
	}
	if row, err := c.Get(ctx, "walk/a key?with#odd:chars"); err != nil || row.DispatchKey != "walk/a key?with#odd:chars" {
		t.Errorf("Get of a key with '/', ' ', '?', '#': %+v, %v", row, err)
	}
	if _, err := c.Get(ctx, "walk-missing"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Get(walk-missing): %v, want not_found", err)
	}
	// The walk rows visible now go to the default target before the
	// namespace's own target is set below (in exact quota mode the first
	// claim waits for a capacity lease, a few ms; a row still pending when
	// "/unused/{namespace}" is set would be delivered there).
	for _, k := range []string{"walk-1", "walk/a key?with#odd:chars"} {
		until := time.Now().Add(10 * time.Second)
		for {
			r, err := c.Get(ctx, k)
			if err == nil && r.Status == client.StatusDone {
				break
			}
			if time.Now().After(until) {
				t.Fatalf("%s not delivered to the default target within 10 s: %+v, %v", k, r, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	ns, err := c.SetMaxInFlight(ctx, "walk", 7)
	must("SetMaxInFlight", err)
	if ns.MaxInFlight != 7 || ns.MaxInFlightDefault {
		t.Errorf("after SetMaxInFlight(7): %+v", ns)
	}
	_, err = c.Pause(ctx, "walk")
	must("Pause", err)
	ns, err = c.UpdateNamespace(ctx, "walk", client.NamespaceUpdate{Retry: &client.NamespaceRetry{Base: time.Second, Cap: time.Minute, MaxAttempts: 5}})
	must("UpdateNamespace retry", err)
	if !ns.Paused || ns.Retry == nil || ns.Retry.Base != time.Second || ns.Retry.Cap != time.Minute || ns.Retry.MaxAttempts != 5 {
		t.Errorf("after Pause and a retry override: %+v (retry %+v)", ns, ns.Retry)
	}
	ns, err = c.UpdateNamespace(ctx, "walk", client.NamespaceUpdate{DefaultMaxInFlight: true, DefaultRetry: true})
	must("UpdateNamespace defaults", err)
	if !ns.MaxInFlightDefault || ns.Retry != nil {
		t.Errorf("after restoring defaults: %+v", ns)
	}
	_, err = c.Resume(ctx, "walk")
	must("Resume", err)
	got, err := c.GetNamespace(ctx, "walk")
	must("GetNamespace", err)
	if got.Paused || got.Name != "walk" {
		t.Errorf("GetNamespace(walk) = %+v", got)
	}
	list, err := c.ListNamespaces(ctx)
	must("ListNamespaces", err)
	if !slices.ContainsFunc(list, func(n client.Namespace) bool { return n.Name == "walk" }) {
		t.Errorf("ListNamespaces lacks walk: %+v", list)
	}

	tg, err := c.SetTarget(ctx, "walk", "q", client.Target{URL: proxyURL + "/unused/{namespace}", Timeout: 2 * time.Second})
	must("SetTarget", err)
	if tg.Timeout != 2*time.Second || !strings.HasSuffix(tg.URL, "/unused/{namespace}") {
		t.Errorf("SetTarget = %+v", tg)
	}
	tv, err := c.GetTarget(ctx, "walk", "q")
	must("GetTarget", err)
	if tv.Source != "route" || tv.TimeoutMS != 2000 || !strings.HasSuffix(tv.URL, "/unused/{namespace}") {
		t.Errorf("GetTarget = %+v", tv)
	}
	tl, err := c.ListTargets(ctx)
	must("ListTargets", err)
	if !slices.ContainsFunc(tl.Targets, func(v client.TargetView) bool { return v.Namespace == "walk" && v.TaskQueue == "q" }) {
		t.Errorf("ListTargets lacks walk/q: %+v", tl)
	}
	// Signed, with a static header: the request and the redacted answer
	// match the spec too.
	tg, err = c.SetTarget(ctx, "walk", "q", client.Target{URL: proxyURL + "/unused/{namespace}",
		SigningSecrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_" + strings.Repeat("QUJD", 8)},
		Headers:        map[string]string{"Authorization": "Bearer walk-token"}})
	must("SetTarget signed", err)
	if len(tg.SigningSecretFingerprints) != 2 || len(tg.SigningSecrets) != 0 || !slices.Equal(tg.HeaderNames, []string{"Authorization"}) || tg.Headers != nil {
		t.Errorf("SetTarget signed = %+v", tg)
	}
	// A reserved header is refused with the field named.
	_, err = c.SetTarget(ctx, "walk", "q", client.Target{URL: proxyURL + "/x", Headers: map[string]string{"Transfer-Encoding": "chunked"}})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Field != "headers.Transfer-Encoding" {
		t.Errorf("SetTarget with a reserved header: %v, want a 400 naming headers.Transfer-Encoding", err)
	}
	must("DeleteTarget", c.DeleteTarget(ctx, "walk", "q"))
	must("Hold", c.Hold(ctx, "walk/wf 1"))
	held, err := c.ListHolds(ctx)
	must("ListHolds", err)
	if !slices.Contains(held, "walk/wf 1") {
		t.Errorf("ListHolds = %v, want walk/wf 1 in it", held)
	}
	isHeld, err := c.IsHeld(ctx, "walk/wf 1")
	must("IsHeld", err)
	if !isHeld {
		t.Error("IsHeld(walk/wf 1) = false after Hold")
	}
	must("Release", c.Release(ctx, "walk/wf 1"))
	rp, err := c.ListRows(ctx, "walk", client.RowQuery{Limit: 1})
	must("ListRows", err)
	if len(rp.Rows) != 1 || rp.Rows[0].DispatchKey != "walk-1" || rp.Next != "walk-1" {
		t.Errorf("ListRows(walk, limit 1) = %+v", rp)
	}
	if _, err := c.Append(ctx, client.Row{DispatchKey: "walk-cancel", Namespace: "walk", Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	cr, err := c.Cancel(ctx, "walk-cancel", "walkthrough")
	must("Cancel", err)
	if !cr.Cancelled || cr.Row == nil || cr.Row.Status != client.StatusCancelled || cr.Row.LastError != "walkthrough" {
		t.Errorf("Cancel(walk-cancel) = %+v", cr)
	}

	// The three walk-dl rows become dead letters (the target answers 422).
	deadline := time.Now().Add(20 * time.Second)
	for {
		page, err := c.DeadLetters(ctx, "walk-dl", client.DeadLetterQuery{Limit: 10})
		must("DeadLetters", err)
		if len(page.Rows) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("3 dead letters expected in walk-dl, have %+v", page)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var keys []string
	pages := 0
	for page, err := range c.DeadLetterPages(ctx, "walk-dl", 2) {
		must("DeadLetterPages", err)
		pages++
		for _, r := range page.Rows {
			keys = append(keys, r.DispatchKey)
			if r.Status != client.StatusFailed || r.LastError == "" {
				t.Errorf("dead letter %+v: want status failed and a last_error", r)
			}
		}
	}
	if fmt.Sprint(keys) != "[walk-dead-1 walk-dead-2 walk-dead-3]" || pages != 2 {
		t.Errorf("DeadLetterPages(limit 2) gave keys %v in %d pages; want the three keys in order, in 2 pages", keys, pages)
	}
	rr, err := c.Redrive(ctx, "walk-dl", "walk-dead-1")
	must("Redrive keys", err)
	if rr.Redriven != 1 || len(rr.UnreachableNodes) != 0 {
		t.Errorf("Redrive(walk-dead-1) = %+v, want 1 redriven", rr)
	}
	_, err = c.Redrive(ctx, "walk-dl")
	must("Redrive all", err)
	pr, err := c.PurgeDeadLetters(ctx, "walk-dl", "walk-none")
	must("PurgeDeadLetters", err)
	if pr.Purged != 0 {
		t.Errorf("PurgeDeadLetters of a key that is no dead letter = %+v", pr)
	}

	cl, err := c.Cluster(ctx)
	must("Cluster", err)
	if len(cl.Members) != 1 || cl.Members[0].OwnedShards != int(cl.ShardCount) {
		t.Errorf("Cluster = %+v", cl)
	}
	st, err := c.Shards(ctx)
	must("Shards", err)
	if len(st.Shards) != int(st.ShardCount) || st.Shards[5].Shard != 5 || st.Shards[5].Owner != cl.Node {
		t.Errorf("Shards: %d shards of %d, shard 5 = %+v", len(st.Shards), st.ShardCount, st.Shards[5])
	}
}
