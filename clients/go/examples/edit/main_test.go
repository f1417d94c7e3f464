package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"aaa.dev/clients/go/internal/testserver"
)

func TestPrintsTheEditedScenario(t *testing.T) {
	server := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, server.Addr, &out); err != nil {
		t.Fatalf("run: %v\nserver log:\n%s", err, server.Log())
	}
	want := "waiting for approval of: wire_money {\"amount\":250,\"to\":\"ACME\"}\n" +
		"the model read: [a reviewer changed the arguments to {\"amount\":200,\"to\":\"ACME\"} (reason: over the daily limit) before the call ran] sent $200 to ACME\n"
	if out.String() != want {
		t.Errorf("printed:\n%s\nwant:\n%s", out.String(), want)
	}
}
