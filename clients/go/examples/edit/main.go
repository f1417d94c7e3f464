// Command edit is aaa's reference scenario, edited: the human changes the
// arguments of the gated call before granting it, so the tool runs with the
// edited arguments and never with the requested ones.
//
// Start a server (`cargo run --release -- serve` in the repository), then
// `go run ./examples/edit` in clients/go (the address comes from env
// AAA_SERVER, default 127.0.0.1:50051). It prints:
//
//	waiting for approval of: wire_money {"amount":250,"to":"ACME"}
//	the model read: [a reviewer changed the arguments to {"amount":200,"to":"ACME"} (reason: over the daily limit) before the call ran] sent $200 to ACME
//
// The model reads the edited call's result as the answer to the call it
// made, after a note of the new arguments and the reviewer's reason.
package main

import (
	"context"
	"encoding/json"
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

// wireMoney is the tool that must not run without a human's grant.
var wireMoney = aaa.Tool{
	Name:             "wire_money",
	Description:      "Send money",
	Parameters:       json.RawMessage(`{"type":"object","properties":{"amount":{"type":"integer"},"to":{"type":"string"}},"required":["amount","to"]}`),
	RequiresApproval: true,
	Handler: aaa.Typed(func(ctx context.Context, t transfer) (string, error) {
		return fmt.Sprintf("sent $%d to %s", t.Amount, t.To), nil
	}),
}

// seed is a fake LLM: asked by the user, it calls wire_money; otherwise it
// repeats the last message (the tool's output, as the model reads it).
func seed(ctx context.Context, req *aaa.ModelRequest) (aaa.Reply, error) {
	last := req.Messages[len(req.Messages)-1]
	if last.Role == aaa.RoleUser {
		call := aaa.ToolCallRequest{Name: "wire_money", Arguments: transfer{Amount: 250, To: "ACME"}}
		return aaa.Reply{ToolCalls: []aaa.ToolCallRequest{call}}, nil
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

	// The human grants $200 instead: the call for $250 never runs, and the
	// edit applies only to the arguments the human was shown.
	_, err = client.Edit(ctx, started.RunID, approval.CallID, transfer{Amount: 200, To: "ACME"},
		aaa.WithArgumentsSHA256(approval.ArgumentsSHA256),
		aaa.WithReason("over the daily limit"),
		aaa.WithGrant())
	if err != nil {
		return err
	}
	outcome, err := client.Result(ctx, started.RunID)
	if err != nil {
		return err
	}
	if outcome.Status != aaa.StatusCompleted {
		return fmt.Errorf("run %s ended %s: %v", started.RunID, outcome.Status, outcome.Error)
	}
	fmt.Fprintln(out, "the model read:", outcome.Text)
	return nil
}
