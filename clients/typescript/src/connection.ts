/**
 * The connection to an aaa server or to the servers of a cluster: the HTTP/2 sessions with the
 * token and TLS settings, the generated service clients, unary calls retried while the server is
 * unavailable, and closing. {@link Connection} is what everything that makes calls needs (the
 * worker, a run's handle); the SDK's `Client` is a `Connection` with the SDK's calls on top.
 *
 * @module
 */

import { createClient, type CallOptions, type Client as ServiceClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { ApprovalService } from "./gen/aaa/v1/approval_pb.js";
import { GrantService } from "./gen/aaa/v1/grant_pb.js";
import { PolicyService } from "./gen/aaa/v1/policy_pb.js";
import { RunService } from "./gen/aaa/v1/run_pb.js";
import { SubscriptionService } from "./gen/aaa/v1/subscription_pb.js";
import { WorkerService } from "./gen/aaa/v1/worker_pb.js";
import { Backoff, anySignal, cancelledBy } from "./backoff.js";
import { Cancelled, Code, Unavailable, notCancelledError } from "./errors.js";
import { RECONNECT_MIN_MS, RoundRobin, hostPort, type Member, type ShardOwners } from "./route.js";

/** The address used when none is given and env AAA_SERVER is not set. */
export const DEFAULT_ADDRESS = "127.0.0.1:50051";

/** Options of `connect`. */
export interface ConnectOptions {
  /** How long `connect` waits for the server to answer before throwing `Unavailable`; default 10 000 ms. */
  timeoutMs?: number;
  /** How long calls keep retrying while the server is unavailable; default 30 000 ms. */
  retryMs?: number;
  /** Sent as `authorization: Bearer TOKEN` with every call; defaults to env AAA_TOKEN. */
  token?: string;
  /** Connect over TLS (also implied by an https:// address). */
  tls?: TlsOptions;
}

/** TLS settings of a connection, PEM text (or Buffers). */
export interface TlsOptions {
  /** CA certificates to trust instead of the system's, for a private CA. */
  ca?: string | Buffer;
  /** A client certificate chain (mTLS), with its `key`. */
  cert?: string | Buffer;
  /** The client certificate's private key. */
  key?: string | Buffer;
  /** The name the server certificate must carry, when it differs from the address's host. */
  servername?: string;
}

/** Options every call of the SDK takes. */
export interface CallControl {
  /** Abort the call (it rejects with `Cancelled`). */
  signal?: AbortSignal;
  /** Give up after this many milliseconds (it rejects with `Timeout`). */
  timeoutMs?: number;
}

/**
 * Sessions to an aaa server (or to the servers of a cluster) and the service clients on them.
 * The SDK's `Client` is one; create it with `connect`.
 */
export class Connection {
  /** The server address ("host:port" or URL); those of an array joined by commas. */
  readonly address: string;
  /** The server addresses: one, unless an array was given. */
  readonly addresses: readonly string[];
  /** How long calls retry while the server is unavailable (ms). */
  readonly retryMs: number;
  /**
   * The generated service clients (@connectrpc/connect), for anything the SDK
   * does not wrap. They throw `ConnectError`; {@link toAaaError} converts.
   */
  readonly services: {
    readonly run: ServiceClient<typeof RunService>;
    readonly approval: ServiceClient<typeof ApprovalService>;
    readonly worker: ServiceClient<typeof WorkerService>;
    readonly subscription: ServiceClient<typeof SubscriptionService>;
    readonly policy: ServiceClient<typeof PolicyService>;
    readonly grant: ServiceClient<typeof GrantService>;
  };
  /** The HTTP/2 connection manager (exposed for `connect` and tests); of the first address when there are several. */
  readonly sessions: Http2SessionManager;
  /** The HTTP/2 connection manager of each address, in the order of {@link addresses}. */
  readonly allSessions: readonly Http2SessionManager[];
  /** With several addresses: which of them owns which runs (read by `connect`). */
  private readonly shardOwners: ShardOwners | undefined;
  private readonly closing = new AbortController();

  /** Creates a connection without waiting for the server; prefer `connect` (of the client). */
  constructor(address?: string | readonly string[], options: ConnectOptions = {}) {
    this.addresses =
      address === undefined || typeof address === "string" ? [address || process.env.AAA_SERVER || DEFAULT_ADDRESS] : [...address];
    if (this.addresses.length === 0) throw new TypeError("no server address given");
    this.address = this.addresses.join(",");
    this.retryMs = options.retryMs ?? 30_000;
    const scheme = options.tls ? "https" : "http";
    const pings = { pingIntervalMs: 30_000, pingTimeoutMs: 10_000 };
    const token = options.token ?? process.env.AAA_TOKEN;
    const bearer: Interceptor = (next) => (request) => {
      request.header.set("authorization", `Bearer ${token}`);
      return next(request);
    };
    const interceptors = token ? [bearer] : [];
    const members = this.addresses.map((server): Member => {
      const baseUrl = /^https?:\/\//.test(server) ? server : `${scheme}://${server}`;
      const sessions = new Http2SessionManager(baseUrl, pings, options.tls);
      const transport = createGrpcTransport({ baseUrl, sessionManager: sessions, interceptors });
      return { address: hostPort(server), sessions, transport, probing: false, retryAt: 0, delay: RECONNECT_MIN_MS };
    });
    this.allSessions = members.map((m) => m.sessions);
    this.sessions = this.allSessions[0];
    const roundRobin = members.length === 1 ? undefined : new RoundRobin(members, this.closing.signal);
    this.shardOwners = roundRobin?.owners;
    const transport = roundRobin ?? members[0].transport;
    this.services = {
      run: createClient(RunService, transport),
      approval: createClient(ApprovalService, transport),
      worker: createClient(WorkerService, transport),
      subscription: createClient(SubscriptionService, transport),
      policy: createClient(PolicyService, transport),
      grant: createClient(GrantService, transport),
    };
  }

  /** Aborted when the client is closed; every call of the SDK listens to it. */
  get closeSignal(): AbortSignal {
    return this.closing.signal;
  }

  /** Closes the connection; calls and streams still in flight reject with `Cancelled`. Stop workers first. */
  close(): void {
    if (!this.closing.signal.aborted) {
      this.closing.abort(new Cancelled("the client was closed", { code: Code.Canceled }));
    }
    for (const sessions of this.allSessions) sessions.abort();
  }

  /**
   * Makes a unary call of a generated service client, retrying UNAVAILABLE
   * for up to `retryMs`, and throws typed errors. `retry: false` makes one try.
   */
  async call<T>(
    method: (options: CallOptions) => Promise<T>,
    control: CallControl & { retry?: boolean } = {},
  ): Promise<T> {
    const backoff = new Backoff(control.retry === false ? 0 : this.retryMs);
    const signal = anySignal(this.closing.signal, control.signal);
    const deadline = control.timeoutMs === undefined ? undefined : Date.now() + control.timeoutMs;
    for (;;) {
      const timeoutMs = deadline === undefined ? undefined : Math.max(1, deadline - Date.now());
      try {
        return await method({ signal, timeoutMs });
      } catch (err) {
        if (signal.aborted) throw cancelledBy(signal);
        const error = notCancelledError(err);
        if (error instanceof Unavailable && !(deadline !== undefined && Date.now() >= deadline)) {
          if (await backoff.wait(signal)) continue;
        }
        throw error;
      }
    }
  }
}
