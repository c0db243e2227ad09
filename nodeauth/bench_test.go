package nodeauth_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/fairshard/fairshard/nodeauth"
)

// BenchmarkRoundTrip measures one node-to-node POST over loopback with a
// body of a handoff batch's size, signed both ways vs unsigned (the cost
// nodeauth adds: SHA-256 of body and answer, two HMACs, buffering).
func BenchmarkRoundTrip(b *testing.B) {
	for _, size := range []int{1 << 10, 1 << 20, 8 << 20} {
		body := bytes.Repeat([]byte("x"), size)
		for _, signed := range []bool{false, true} {
			var auth *nodeauth.Auth
			if signed {
				var err error
				if auth, err = nodeauth.New(nodeauth.Config{Secrets: [][]byte{secretA}}); err != nil {
					b.Fatal(err)
				}
			}
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				_, _ = w.Write([]byte(`{"created":500,"updated":0,"skipped":0}`))
			})
			srv := httptest.NewServer(auth.Middleware(h))
			client := auth.Client(&http.Transport{}, 0)
			name := map[bool]string{false: "unsigned", true: "signed"}[signed]
			b.Run(name+"/"+sizeName(size), func(b *testing.B) {
				b.SetBytes(int64(size))
				for b.Loop() {
					resp, err := client.Post(srv.URL+"/internal/v1/handoff", "application/octet-stream", bytes.NewReader(body))
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
			client.CloseIdleConnections()
			srv.Close()
		}
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return strconv.Itoa(n>>20) + "MiB"
	}
	return strconv.Itoa(n>>10) + "KiB"
}
