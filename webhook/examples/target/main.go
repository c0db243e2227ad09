// Command target is the API guide's target verifying signatures
// (docs/api.md, "Signed deliveries and target headers"): an HTTP endpoint
// that accepts a fairshard delivery only when its Standard Webhooks
// signature verifies with the secret given in $WEBHOOK_SECRET (a test
// keeps the guide's copy identical).
package main

import (
	"io"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/fairshard/fairshard/webhook"
)

func main() {
	secret, err := webhook.ParseSecret(os.Getenv("WEBHOOK_SECRET")) // whsec_…, as given to PUT …/target
	if err != nil {
		log.Fatal(err)
	}
	http.HandleFunc("POST /hook", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err := webhook.Verify(r.Header, body, time.Now(), 0, secret); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized) // not from fairshard, or replayed
			return
		}
		log.Printf("row %s: %s", r.Header.Get("webhook-id"), body) // webhook-id is the dispatch_key
	})
	log.Fatal(http.ListenAndServe(":9000", nil))
}
