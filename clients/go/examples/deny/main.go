// Command deny is aaa's reference scenario, denied: the tool never runs, and
// the model reads the refusal as the tool's result and explains it.
//
// Start a server (`cargo run --release -- serve` in the repository), then
// `go run ./examples/deny` in clients/go (the address comes from env
// AAA_SERVER, default 127.0.0.1:50051). It prints:
//
//	waiting for approval of: wire_money {"amount":250,"to":"ACME"}
//	I did not pay ACME: the transfer was refused (over the daily limit).
//
// A denial reaches the model as a tool message whose Error has type
// "ApprovalDenied" and the reason as message.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"

	aaa "aaa.dev/clients/go"
)

// transfer is wire_money's arguments.
type transfer struct {
	Amount int64  `json:"amount"`
	To     string `json:"to"`
}

// errRan is what wire_money returns: in this scenario it must never run.
var errRan = errors.New("wire_money ran without a grant")

// wireMoney is the tool that must not run without a human's grant.
var wireMoney = aaa.Tool{
	Name:             "wire_money",
	Description:      "Send money",
	Parameters:       json.RawMessage(`{"type":"object","properties":{"amount":{"type":"integer"},"to":{"type":"string"}},"required":["amount","to"]}`),
	RequiresApproval: true,
	Handler: aaa.Typed(func(ctx context.Context, t transfer) (string, error) {
		return "", errRan
	}),
}

// seed is a fake LLM that explains a refused tool call.
func seed(ctx context.Context, req *aaa.ModelRequest) (aaa.Reply, error) {
	last := req.Messages[len(req.Messages)-1]
	switch {
	case last.Role == aaa.RoleUser:
		call := aaa.ToolCallRequest{Name: "wire_money", Arguments: transfer{Amount: 250, To: "ACME"}}
		return aaa.Reply{ToolCalls: []aaa.ToolCallRequest{call}}, nil
	case last.Error != nil && last.Error.Type == "ApprovalDenied":
		return aaa.Reply{Content: fmt.Sprintf("I did not pay ACME: the transfer was refused (%s).", last.Error.Message)}, nil
	}
	return aaa.Reply{Content: last.Content}, nil
}

func main() {
	if err := run(context.Background(), os.Getenv("AAA_SERVER"), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run plays the scenario against the server at addr, printing to out.
func run(ctx context.Context, addr string, out io.Writer) error {
	client, err := aaa.Dial(addr)
	if err != nil {
		return err
	}
	defer client.Close()

	worker := aaa.NewWorker(client, aaa.WorkerOptions{
		Identity: "payments-1",
		Tools:    []aaa.Tool{wireMoney},
		Models:   map[string]aaa.ModelFunc{"seed": seed},
	})
	if _, err := worker.Register(ctx); err != nil {
		return err
	}
	workerCtx, stopWorker := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- worker.Run(workerCtx) }()
	defer func() { stopWorker(); <-stopped }()

	started, err := client.StartRun(ctx, aaa.StartRunRequest{
		Task:  "Pay ACME $250",
		Model: aaa.WorkerModel("seed"),
		Tools: []aaa.ToolRef{{Name: "wire_money"}},
	})
	if err != nil {
		return err
	}

	// This time the human looks at the approval inbox, and says no.
	var approval *aaa.Approval
	for update, err := range client.WatchApprovals(ctx, aaa.WatchOptions{ApprovalFilter: aaa.ApprovalFilter{RunID: started.RunID}}) {
		if err != nil {
			return err
		}
		if update.Kind == aaa.Requested {
			approval = update.Approval
			break
		}
	}
	fmt.Fprintln(out, "waiting for approval of:", approval.Tool, string(approval.Arguments))
	if _, err := client.Deny(ctx, started.RunID, approval.CallID, "over the daily limit"); err != nil {
		return err
	}
	outcome, err := client.Result(ctx, started.RunID)
	if err != nil {
		return err
	}
	if outcome.Status != aaa.StatusCompleted {
		return fmt.Errorf("run %s ended %s: %v", started.RunID, outcome.Status, outcome.Error)
	}
	fmt.Fprintln(out, outcome.Text)
	return nil
}
