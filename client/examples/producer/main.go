// Command producer is the README's 10-line Go producer: it appends one row
// through package client (a test keeps the README's copy identical).
package main

import (
	"context"
	"encoding/json"
	"log"

	"github.com/fairshard/fairshard/client"
)

func main() {
	c, err := client.New(client.Options{Nodes: []string{"http://127.0.0.1:8080", "http://127.0.0.2:8080"}})
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.Append(context.Background(), client.Row{DispatchKey: "order-42:email", Namespace: "acme",
		TaskQueue: "mail", Payload: json.RawMessage(`{"to":"a@example.com"}`)})
	if err != nil {
		log.Fatal(err) // retrying is safe: rows are deduplicated by dispatch_key
	}
	log.Printf("%s: %s, on node %s", res[0].DispatchKey, res[0].Status, res[0].Node)
}
