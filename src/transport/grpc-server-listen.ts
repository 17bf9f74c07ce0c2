import { type Server, ServerCredentials } from '@grpc/grpc-js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { formatHostPort } from '../protocol/host-port.js';

export interface GrpcServerTlsOptions {
  certPem: string | Buffer;
  keyPem: string | Buffer;
  /** PEM roots for client certificates; with `requireClientCert` this is mutual TLS. */
  caPem?: string | Buffer;
  requireClientCert?: boolean;
}

/** A gRPC server bound to its address; `close` lets calls finish for the grace, then cuts them. */
export interface ListeningGrpcServer {
  /** `host:port` with the real port when bound to port 0. */
  readonly address: string;
  readonly port: number;
  close(): Promise<void>;
}

/** Plaintext without `tls`; TLS, or mutual TLS with `requireClientCert` and `caPem`. */
export function grpcServerCredentials(tls: GrpcServerTlsOptions | undefined): ServerCredentials {
  if (!tls) return ServerCredentials.createInsecure();
  if (tls.requireClientCert === true && tls.caPem === undefined) {
    // grpc-js would verify client certificates against whatever roots the environment names
    // (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, or Node's public CAs): any publicly signed one would pass.
    throw new SpillwayError(
      ErrorCode.InvalidOption,
      'tls.requireClientCert needs tls.caPem, the CAs of client certificates',
      { field: 'tls.caPem' },
    );
  }
  return ServerCredentials.createSsl(
    tls.caPem !== undefined ? Buffer.from(tls.caPem) : null,
    [{ cert_chain: Buffer.from(tls.certPem), private_key: Buffer.from(tls.keyPem) }],
    tls.requireClientCert ?? false,
  );
}

/** Binds `server` (its services added) on `host:port` and answers how to reach and close it. */
export async function listenGrpcServer(
  server: Server,
  listen: { host: string; port: number; credentials: ServerCredentials; shutdownGraceMs: number },
): Promise<ListeningGrpcServer> {
  const port = await new Promise<number>((resolve, reject) => {
    server.bindAsync(formatHostPort(listen.host, listen.port), listen.credentials, (error, bound) =>
      error ? reject(error) : resolve(bound),
    );
  });
  let closing: Promise<void> | undefined;
  return {
    address: formatHostPort(listen.host, port),
    port,
    close() {
      closing ??= new Promise<void>((resolve) => {
        const force = setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, listen.shutdownGraceMs);
        force.unref();
        server.tryShutdown(() => {
          clearTimeout(force);
          resolve();
        });
      });
      return closing;
    },
  };
}
