package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/fairshard/fairshard/client"
)

// Each example runs against a real node that exampleNodes starts in this
// process (see main_test.go); in your code, Nodes are your cluster's URLs.

func ExampleClient_Append() {
	ctx := context.Background()
	c, err := client.New(client.Options{Nodes: exampleNodes()}) // e.g. "http://10.0.0.1:8080", "http://10.0.0.2:8080"
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	results, err := c.Append(ctx,
		client.Row{DispatchKey: "order-42:email", Namespace: "acme", TaskQueue: "mail",
			Payload: json.RawMessage(`{"to":"a@example.com"}`)},
		client.Row{WorkflowID: "wf-7", Ordinal: 3, PayloadBytes: []byte("hello"), ContentType: "text/plain",
			Delay: 5 * time.Second},
	)
	if err != nil {
		log.Fatal(err) // retrying the same rows is safe: they are deduplicated by dispatch_key
	}
	for _, r := range results {
		fmt.Println(r.DispatchKey, r.Status, "shard", r.Shard, "on", r.Node)
	}

	// Appending a row again changes nothing.
	again, _ := c.Append(ctx, client.Row{DispatchKey: "order-42:email", Namespace: "acme", TaskQueue: "mail"})
	fmt.Println(again[0].DispatchKey, again[0].Status)
	// Output:
	// order-42:email created shard 698 on n1
	// wf-7:3 created shard 375 on n1
	// order-42:email duplicate
}

func ExampleClient_Get() {
	ctx := context.Background()
	c, err := client.New(client.Options{Nodes: exampleNodes()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if _, err := c.Append(ctx, client.Row{DispatchKey: "invoice-9", Namespace: "billing",
		Payload: json.RawMessage(`{"amount":12}`), Delay: time.Hour}); err != nil {
		log.Fatal(err)
	}
	row, err := c.Get(ctx, "invoice-9")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(row.DispatchKey, row.Namespace, row.TaskQueue, row.Status, row.Attempt, string(row.Payload))
	fmt.Println("delayed by about an hour:", row.VisibleAfter.Sub(row.CreatedAt).Round(time.Minute))

	_, err = c.Get(ctx, "no-such-key")
	fmt.Println("not found:", errors.Is(err, client.ErrNotFound))
	// Output:
	// invoice-9 billing default pending 1 {"amount":12}
	// delayed by about an hour: 1h0m0s
	// not found: true
}

func ExampleClient_UpdateNamespace() {
	ctx := context.Background()
	c, err := client.New(client.Options{Nodes: exampleNodes()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ns, err := c.UpdateNamespace(ctx, "acme", client.NamespaceUpdate{
		MaxInFlight: new(uint32(8)), // at most 8 of acme's rows in delivery at once, cluster-wide
		Retry:       &client.NamespaceRetry{Base: time.Second, Cap: time.Minute, MaxAttempts: 5},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ns.Name, "quota", ns.MaxInFlight, "paused", ns.Paused, "retry cap", ns.Retry.Cap)

	ns, _ = c.Pause(ctx, "acme")
	fmt.Println("paused", ns.Paused, "ceiling", ns.Ceiling)
	ns, _ = c.Resume(ctx, "acme")
	// Exact mode (the default): this node's ceiling is its capacity lease,
	// 0 until it has rows of acme to deliver.
	fmt.Println("paused", ns.Paused, "mode", ns.Mode, "ceiling", ns.Ceiling)
	// Proportional mode: ceil(quota × owned/total), here one node owning all.
	ns, _ = c.UpdateNamespace(ctx, "acme", client.NamespaceUpdate{Mode: "proportional"})
	fmt.Println("mode", ns.Mode, "ceiling", ns.Ceiling)
	// Output:
	// acme quota 8 paused false retry cap 1m0s
	// paused true ceiling 0
	// paused false mode exact ceiling 0
	// mode proportional ceiling 8
}

func ExampleClient_SetTarget() {
	ctx := context.Background()
	c, err := client.New(client.Options{Nodes: exampleNodes()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	t, err := c.SetTarget(ctx, "acme", "mail", client.Target{
		URL:     "https://mailer.internal/send/{namespace}",
		Timeout: 5 * time.Second,
		// Every delivery signed per Standard Webhooks, and authorized.
		SigningSecrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		Headers:        map[string]string{"Authorization": "Bearer mailer-token"},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Credentials never come back: fingerprints and names only.
	fmt.Println(t.URL, t.Timeout, t.SigningSecretFingerprints, t.HeaderNames)
	if err := c.DeleteTarget(ctx, "acme", "mail"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted")
	// Output:
	// https://mailer.internal/send/{namespace} 5s [f74e1720] [Authorization]
	// deleted
}

func ExampleClient_Hold() {
	ctx := context.Background()
	c, err := client.New(client.Options{Nodes: exampleNodes()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The workflow's rows wait while it is held…
	if err := c.Hold(ctx, "wf-7"); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Append(ctx, client.Row{WorkflowID: "wf-7", Ordinal: 1}); err != nil {
		log.Fatal(err)
	}
	row, _ := c.Get(ctx, "wf-7:1")
	fmt.Println(row.DispatchKey, row.Status)

	// …and flow again once it is released.
	if err := c.Release(ctx, "wf-7"); err != nil {
		log.Fatal(err)
	}
	for range 500 {
		if row, _ = c.Get(ctx, "wf-7:1"); row.Status == client.StatusDone {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println(row.DispatchKey, row.Status)
	// Output:
	// wf-7:1 pending
	// wf-7:1 done
}

func ExampleClient_DeadLetterPages() {
	ctx := context.Background()
	c, err := client.New(client.Options{Nodes: exampleNodes()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The example target refuses task queue "rejected" with a 422: its rows
	// become dead letters at once.
	var rows []client.Row
	for i := range 5 {
		rows = append(rows, client.Row{DispatchKey: fmt.Sprintf("inv-%d", i), Namespace: "billing", TaskQueue: "rejected"})
	}
	if _, err := c.Append(ctx, rows...); err != nil {
		log.Fatal(err)
	}
	for range 500 {
		if page, err := c.DeadLetters(ctx, "billing", client.DeadLetterQuery{}); err == nil && len(page.Rows) == 5 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	for page, err := range c.DeadLetterPages(ctx, "billing", 2) {
		if err != nil {
			log.Fatal(err)
		}
		for _, r := range page.Rows {
			fmt.Printf("%s %s %q  ", r.DispatchKey, r.Status, r.LastError)
		}
		fmt.Printf("| next: %q\n", page.Next)
	}

	res, err := c.Redrive(ctx, "billing", "inv-0", "inv-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("redriven:", res.Redriven, "unreachable nodes:", res.UnreachableNodes)
	// Output:
	// inv-0 failed "HTTP 422: invoice number missing"  inv-1 failed "HTTP 422: invoice number missing"  | next: "inv-1"
	// inv-2 failed "HTTP 422: invoice number missing"  inv-3 failed "HTTP 422: invoice number missing"  | next: "inv-3"
	// inv-4 failed "HTTP 422: invoice number missing"  | next: ""
	// redriven: 2 unreachable nodes: []
}

func ExampleClient_Cluster() {
	ctx := context.Background()
	c, err := client.New(client.Options{Nodes: exampleNodes()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	cl, err := c.Cluster(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("accepted:", cl.Accepted)
	for _, m := range cl.Members {
		fmt.Println(m.Name, m.State, m.OwnedShards, "of", cl.ShardCount, "shards, gossip keys:", len(m.GossipKeys), "gossip address set:", m.GossipAddr != "")
	}
	r := cl.Replication
	fmt.Println("copies:", r.Copies, "of R =", r.Factor, "under-replicated:", r.UnderReplicated)
	// Output:
	// accepted: true
	// n1 active 1024 of 1024 shards, gossip keys: 0 gossip address set: true
	// copies: 1 of R = 2 under-replicated: true
}

func ExampleError() {
	ctx := context.Background()
	c, err := client.New(client.Options{Nodes: exampleNodes()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	_, err = c.Append(ctx,
		client.Row{DispatchKey: "a", Namespace: "acme"},
		client.Row{DispatchKey: "b", Namespace: "not a valid name"},
	)
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		fmt.Println(apiErr.StatusCode, apiErr.Code, apiErr.Field)
	}
	fmt.Println("invalid field:", errors.Is(err, client.ErrInvalidField))
	// The whole batch was refused: row "a" was not stored either.
	_, err = c.Get(ctx, "a")
	fmt.Println("a stored:", !errors.Is(err, client.ErrNotFound))
	// Output:
	// 400 invalid_field rows[1].namespace
	// invalid field: true
	// a stored: false
}
