package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"aaa.dev/clients/go/internal/testserver"
)

func TestPrintsTheDeniedScenario(t *testing.T) {
	server := testserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, server.Addr, &out); err != nil {
		t.Fatalf("run: %v\nserver log:\n%s", err, server.Log())
	}
	want := "waiting for approval of: wire_money {\"amount\":250,\"to\":\"ACME\"}\nI did not pay ACME: the transfer was refused (over the daily limit).\n"
	if out.String() != want {
		t.Errorf("printed:\n%s\nwant:\n%s", out.String(), want)
	}
}
