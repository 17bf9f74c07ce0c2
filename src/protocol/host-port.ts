/** `host:port` as a URL authority or a gRPC target expects it: an IPv6 host goes in brackets. */
export function formatHostPort(host: string, port: number): string {
  return host.includes(':') && !host.startsWith('[') ? `[${host}]:${port}` : `${host}:${port}`;
}
