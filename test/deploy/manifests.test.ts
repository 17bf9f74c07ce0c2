import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { parseAllDocuments } from 'yaml';
import { type CommandSpec, numberFlag, parseFlags } from '../../src/cli/command-line.js';
import { subcommands } from '../../src/cli/main.js';
import { compileLimits, matchBucket } from '../../src/config/compile-limits.js';
import { parseLimitsConfig } from '../../src/config/limits-config.js';
import { parseProxyRules } from '../../src/http/rules/proxy-rules.js';
import { exportedMetricNames, isExported } from './exported-metrics.js';

/**
 * Keeps deploy/ in step with the code: every container argument is parsed by the real command-line
 * parser of its subcommand, ports and Services line up, embedded config files parse, and the Grafana
 * dashboard and Prometheus config use metric names and labels that exist.
 */
const ROOT = join(import.meta.dirname, '../..');
const DEPLOY = join(ROOT, 'deploy');
const VERSION = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
const IMAGE = `spillway:${VERSION}`;

interface Port {
  name?: string;
  containerPort: number;
}
interface Container {
  name: string;
  image: string;
  command?: string[];
  args?: string[];
  ports?: Port[];
  env?: { name: string; valueFrom?: { secretKeyRef?: { name: string } } }[];
  volumeMounts?: { name: string; mountPath: string }[];
  readinessProbe?: { httpGet?: { path: string; port: string | number } };
  livenessProbe?: { httpGet?: { path: string; port: string | number } };
  lifecycle?: { preStop?: { sleep?: { seconds: number }; exec?: { command: string[] } } };
}
interface Volume {
  name: string;
  configMap?: { name: string };
  secret?: { secretName: string };
  persistentVolumeClaim?: { claimName: string };
  emptyDir?: object;
}
interface PodSpec {
  containers: Container[];
  initContainers?: Container[];
  volumes?: Volume[];
  terminationGracePeriodSeconds?: number;
}
interface Manifest {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  data?: Record<string, string>;
  spec?: {
    selector?: { matchLabels?: Record<string, string> } & Record<string, string | object>;
    template?: { metadata: { labels: Record<string, string> }; spec: PodSpec };
    ports?: { name: string; port: number; targetPort: number | string }[];
  };
}

function loadManifests(): { file: string; manifest: Manifest }[] {
  const dir = join(DEPLOY, 'k8s');
  const out: { file: string; manifest: Manifest }[] = [];
  for (const file of readdirSync(dir)
    .filter((f) => f.endsWith('.yaml'))
    .sort()) {
    for (const doc of parseAllDocuments(readFileSync(join(dir, file), 'utf8'))) {
      assert.ok(!('errors' in doc) || doc.errors.length === 0, `${file}: ${String(doc.errors?.[0])}`);
      const manifest = doc.toJS() as Manifest | null;
      if (manifest) out.push({ file, manifest });
    }
  }
  return out;
}

const manifests = loadManifests();
const deployments = manifests.filter((m) => m.manifest.kind === 'Deployment');
const services = manifests.filter((m) => m.manifest.kind === 'Service');
const configMaps = new Map(
  manifests.filter((m) => m.manifest.kind === 'ConfigMap').map((m) => [m.manifest.metadata.name, m.manifest]),
);

/** Spillway containers run by the image's entrypoint (not a shell command): their args are a CLI call. */
function spillwayContainers(): { deployment: Manifest; container: Container; file: string }[] {
  return deployments.flatMap(({ file, manifest }) =>
    [...(manifest.spec!.template!.spec.initContainers ?? []), ...manifest.spec!.template!.spec.containers]
      .filter((c) => c.image.startsWith('spillway:') && c.command === undefined)
      .map((container) => ({ deployment: manifest, container, file })),
  );
}

async function specOf(command: string): Promise<CommandSpec> {
  return ((await import(`../../src/cli/${command}.js`)) as { spec: CommandSpec }).spec;
}

function flagValue(args: string[], flag: string): string | undefined {
  const index = args.lastIndexOf(`--${flag}`);
  return index >= 0 ? args[index + 1] : undefined;
}

/** How long a container's preStop hook holds its SIGTERM back: a `sleep` action, or `exec` of `sleep N`. */
function preStopMs(container: Container): number {
  const hook = container.lifecycle?.preStop;
  if (hook === undefined) return 0;
  if (hook.sleep) return hook.sleep.seconds * 1000;
  const command = hook.exec?.command ?? [];
  assert.equal(command[0], 'sleep', `${container.name}: a preStop hook this test can time (sleep N)`);
  return Number(command[1]) * 1000;
}

function portOf(hostPort: string): number {
  return Number(/:(\d+)$/.exec(hostPort)![1]);
}

function podsSelectedBy(selector: Record<string, string>): { deployment: Manifest; pod: PodSpec }[] {
  return deployments
    .map((d) => d.manifest)
    .filter((d) =>
      Object.entries(selector).every(([key, value]) => d.spec!.template!.metadata.labels[key] === value),
    )
    .map((deployment) => ({ deployment, pod: deployment.spec!.template!.spec }));
}

describe('deploy/k8s manifests', () => {
  it('has a controller, one aggregator per zone, and an app with the proxy as a sidecar', () => {
    const commands = spillwayContainers().map(({ deployment, container }) => [
      deployment.metadata.name,
      container.args![0],
    ]);
    assert.deepEqual(commands, [
      ['spillway-aggregator-zone-a', 'aggregator'],
      ['spillway-aggregator-zone-b', 'aggregator'],
      ['spillway-controller', 'controller'],
      ['example-app', 'proxy'],
    ]);
    const app = deployments.find((d) => d.manifest.metadata.name === 'example-app')!.manifest;
    assert.equal(app.spec!.template!.spec.containers.length, 2, 'app + proxy sidecar in one pod');
  });

  it("every container's args parse with its subcommand's own flag spec (no unknown or missing flags)", async () => {
    const containers = spillwayContainers();
    assert.ok(containers.length >= 4);
    for (const { deployment, container } of containers) {
      const [command, ...rest] = container.args!;
      const where = `${deployment.metadata.name}/${container.name}`;
      assert.ok(command && command in subcommands, `${where}: '${command}' is a spillway subcommand`);
      const spec = await specOf(command);
      const { help } = parseFlags(spec, rest); // throws ERR_SPILLWAY_INVALID_USAGE on any mismatch
      assert.equal(help, false, where);
      for (const arg of rest.filter((a) => a.startsWith('--'))) {
        assert.ok(arg.slice(2) in spec.flags, `${where}: ${arg} is a flag of spillway ${command}`);
      }
    }
  });

  it('proxy pods shut down in order: served through endpoint removal, drained, the app last, all inside the grace period', async () => {
    const spec = await specOf('proxy');
    const proxies = spillwayContainers().filter(({ container }) => container.args![0] === 'proxy');
    assert.ok(proxies.length >= 1);
    for (const { deployment, container } of proxies) {
      const where = `${deployment.metadata.name}/${container.name}`;
      const { values } = parseFlags(spec, container.args!.slice(1));
      // The command's own defaults: 0 and 10 s (src/cli/proxy.ts).
      const delayMs = numberFlag(values, 'shutdown-delay-ms', 0);
      const drainMs = numberFlag(values, 'drain-timeout-ms', 10_000);
      // Kubernetes drops a stopping pod from its endpoints asynchronously: without a delay (or a
      // preStop sleep) the proxy refuses connections still routed to it.
      const acceptsForMs = preStopMs(container) + delayMs;
      assert.ok(
        acceptsForMs >= 3_000,
        `${where}: keeps accepting ${acceptsForMs} ms after the pod starts stopping`,
      );
      const proxyDoneMs = acceptsForMs + drainMs;
      const pod = deployment.spec!.template!.spec;
      // Kubernetes' default grace period is 30 s.
      const graceMs = (pod.terminationGracePeriodSeconds ?? 30) * 1000;
      assert.ok(
        graceMs > proxyDoneMs,
        `${where}: terminationGracePeriodSeconds (${graceMs} ms) exceeds preStop + --shutdown-delay-ms + --drain-timeout-ms (${proxyDoneMs} ms)`,
      );
      // Every container gets SIGTERM at once: the app must still answer what the proxy forwards
      // until the proxy is done.
      for (const other of pod.containers.filter((c) => c !== container)) {
        const otherStopsMs = preStopMs(other);
        assert.ok(
          otherStopsMs >= proxyDoneMs,
          `${deployment.metadata.name}/${other.name}: its preStop (${otherStopsMs} ms) outlasts the proxy's delay and drain (${proxyDoneMs} ms)`,
        );
        assert.ok(
          graceMs > otherStopsMs,
          `${deployment.metadata.name}/${other.name}: preStop fits the grace period`,
        );
      }
    }
  });

  it('uses one image, tagged with the package version, for every Spillway container', () => {
    const images = deployments.flatMap((d) =>
      [
        ...(d.manifest.spec!.template!.spec.initContainers ?? []),
        ...d.manifest.spec!.template!.spec.containers,
      ]
        .map((c) => c.image)
        .filter((image) => image.startsWith('spillway')),
    );
    assert.ok(images.length >= 5);
    for (const image of images) assert.equal(image, IMAGE);
  });

  it('containerPorts match the --listen/--ops/--dashboard ports; the ops port is named ops and probed', () => {
    for (const { deployment, container } of spillwayContainers()) {
      const where = `${deployment.metadata.name}/${container.name}`;
      const args = container.args!;
      const bound = ['listen', 'ops', 'dashboard']
        .map((flag) => [flag, flagValue(args, flag)] as const)
        .filter((entry): entry is readonly [string, string] => entry[1] !== undefined)
        .map(([flag, value]) => [flag, portOf(value)] as const);
      const declared = (container.ports ?? []).map((p) => p.containerPort).sort();
      assert.deepEqual(
        bound.map(([, port]) => port).sort(),
        declared,
        `${where}: bound ports = containerPorts`,
      );
      for (const [flag, value] of bound) {
        assert.ok(value > 0, `${where}: --${flag} has a fixed port`);
        assert.match(
          flagValue(args, flag)!,
          /^0\.0\.0\.0:/,
          `${where}: --${flag} listens on all pod addresses`,
        );
      }
      const opsPort = container.ports!.find((p) => p.name === 'ops');
      assert.equal(opsPort?.containerPort, portOf(flagValue(args, 'ops')!), `${where}: port 'ops' is --ops`);
      assert.equal(container.readinessProbe?.httpGet?.path, '/healthz', where);
      assert.equal(container.readinessProbe?.httpGet?.port, 'ops', where);
    }
  });

  it('every Service selects pods, and each targetPort is a containerPort of those pods', () => {
    assert.ok(services.length >= 4);
    for (const { manifest: service } of services) {
      const selector = service.spec!.selector as Record<string, string>;
      const pods = podsSelectedBy(selector);
      assert.ok(pods.length > 0, `${service.metadata.name} selects a Deployment's pods`);
      for (const port of service.spec!.ports!) {
        for (const { deployment, pod } of pods) {
          const ports = pod.containers.flatMap((c) => c.ports ?? []);
          const match = ports.find((p) =>
            typeof port.targetPort === 'number'
              ? p.containerPort === port.targetPort
              : p.name === port.targetPort,
          );
          assert.ok(
            match,
            `${service.metadata.name}:${port.name} -> ${deployment.metadata.name} has ${port.targetPort}`,
          );
        }
      }
    }
  });

  it('aggregators and proxies report to Services that exist, on their gRPC port', () => {
    const serviceAddress = (target: string) => {
      const [host, port] = target.split(':');
      const [name, namespace] = host!.split('.');
      const service = services.find(
        (s) =>
          s.manifest.metadata.name === name && (s.manifest.metadata.namespace ?? 'default') === namespace,
      );
      assert.ok(service, `${target} names a Service in deploy/k8s`);
      assert.ok(
        service.manifest.spec!.ports!.some((p) => p.port === Number(port) && p.name === 'grpc'),
        `${target}: the Service's grpc port`,
      );
    };
    const parents = spillwayContainers()
      .filter(({ container }) => container.args![0] === 'aggregator')
      .map(({ container }) => flagValue(container.args!, 'parent')!);
    assert.equal(parents.length, 2);
    parents.forEach(serviceAddress);
    const rules = parseProxyRules(
      configMaps.get('example-app-proxy-rules')!.data!['rules.yaml']!,
      'rules.yaml',
    );
    assert.equal(rules.backend.kind, 'global');
    if (rules.backend.kind === 'global') rules.backend.aggregators.forEach(serviceAddress);
  });

  it('embedded config files are valid, and the proxy buckets match controller rules with equal limits', () => {
    const limits = parseLimitsConfig(configMaps.get('spillway-limits')!.data!['limits.yaml']!, 'limits.yaml');
    const compiled = compileLimits(limits);
    assert.ok(
      limits.buckets.some((b) => b.tuning?.auto === true),
      'the example shows an auto-tuned bucket',
    );
    const rules = parseProxyRules(
      configMaps.get('example-app-proxy-rules')!.data!['rules.yaml']!,
      'rules.yaml',
    );
    for (const bucket of rules.buckets) {
      const sampleKey = (bucket.config.key ?? bucket.config.name).replace(/\{[^}]+\}/g, 'x');
      const resolved = matchBucket(compiled, sampleKey);
      assert.ok(resolved, `proxy bucket ${bucket.config.name} (${sampleKey}) has a controller rule`);
      assert.equal(bucket.config.limit / bucket.config.windowSec, resolved.limitRps, bucket.config.name);
    }
  });

  it('mounts what the args name: config and token files on declared volumes, ConfigMaps that exist', () => {
    for (const { deployment, container } of spillwayContainers()) {
      const pod = deployment.spec!.template!.spec;
      const volumes = new Map((pod.volumes ?? []).map((v) => [v.name, v]));
      for (const mount of container.volumeMounts ?? []) {
        const volume = volumes.get(mount.name);
        assert.ok(volume, `${deployment.metadata.name}: volume ${mount.name} declared`);
        if (volume.configMap) assert.ok(configMaps.has(volume.configMap.name), volume.configMap.name);
      }
      for (const flag of ['config', 'history', 'auth-token-file']) {
        const path = flagValue(container.args!, flag);
        if (path === undefined) continue;
        assert.ok(
          (container.volumeMounts ?? []).some((m) => path.startsWith(`${m.mountPath}/`)),
          `${deployment.metadata.name}: --${flag} ${path} is on a mounted volume`,
        );
      }
    }
  });
});

describe('deploy/prometheus and deploy/grafana', () => {
  const exported = exportedMetricNames();

  it('the Grafana dashboard only queries metrics the code exports, and covers the essentials', () => {
    const text = readFileSync(join(DEPLOY, 'grafana/spillway-dashboard.json'), 'utf8');
    const dashboard = JSON.parse(text) as { panels: { targets?: { expr: string }[] }[] };
    const exprs = dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr));
    const used = new Set(exprs.flatMap((e) => [...e.matchAll(/\bspillway_[a-z0-9_]+/g)].map((m) => m[0])));
    assert.ok(used.size >= 15);
    for (const name of used) {
      assert.ok(isExported(exported, name), `${name} is exported by src/`);
    }
    for (const essential of [
      'spillway_controller_offered_rps',
      'spillway_controller_admitted_rps',
      'spillway_dropped_total',
      'spillway_would_drop_total',
      'spillway_controller_drop_ratio',
      'spillway_controller_limit_rps',
      'spillway_report_duration_seconds_bucket',
      'spillway_stale_directives',
    ]) {
      assert.ok(used.has(essential), `the dashboard charts ${essential}`);
    }
  });

  it('Prometheus scrapes the ops port of controller, aggregator and sidecar pods by labels they carry', () => {
    const text = readFileSync(join(DEPLOY, 'prometheus/prometheus.yml'), 'utf8');
    const [doc] = parseAllDocuments(text);
    const config = doc!.toJS() as {
      scrape_configs: { job_name: string; relabel_configs?: { source_labels: string[]; regex: string }[] }[];
    };
    const jobs = new Map(config.scrape_configs.map((j) => [j.job_name, j]));
    const labelOf = (meta: string) =>
      meta
        .replace('__meta_kubernetes_pod_label_', '')
        .replace(/^app_kubernetes_io_/, 'app.kubernetes.io/')
        .replace(/^spillway_dev_/, 'spillway.dev/');
    for (const [job, command] of [
      ['spillway-controller', 'controller'],
      ['spillway-aggregator', 'aggregator'],
      ['spillway-proxy', 'proxy'],
    ] as const) {
      const relabels = jobs.get(job)?.relabel_configs ?? [];
      assert.ok(
        relabels.some(
          (r) => r.source_labels[0] === '__meta_kubernetes_pod_container_port_name' && r.regex === 'ops',
        ),
      );
      const keep = relabels.find((r) => r.source_labels[0]!.startsWith('__meta_kubernetes_pod_label_'))!;
      const pods = spillwayContainers().filter(({ container }) => container.args![0] === command);
      assert.ok(pods.length > 0, job);
      for (const { deployment } of pods) {
        const labels = deployment.spec!.template!.metadata.labels;
        const values = keep.source_labels.map((l) => labels[labelOf(l)] ?? '').join(';');
        assert.match(values, new RegExp(`^(?:${keep.regex})$`), `${job} keeps ${deployment.metadata.name}`);
      }
    }
  });
});

describe('deploy/Dockerfile', () => {
  const dockerfile = readFileSync(join(DEPLOY, 'Dockerfile'), 'utf8');

  it('is multi-stage on node:20-slim, runs as a non-root user, entrypoint is the spillway command', () => {
    const froms = [...dockerfile.matchAll(/^FROM (\S+)/gm)].map((m) => m[1]);
    assert.deepEqual(froms, ['node:20-slim', 'node:20-slim']);
    assert.match(dockerfile, /^RUN npm ci\b/m);
    assert.match(dockerfile, /npm run build/);
    assert.match(dockerfile, /npm prune --omit=dev/);
    const user = [...dockerfile.matchAll(/^USER (\S+)/gm)].at(-1)?.[1];
    assert.ok(user && user !== 'root' && user !== '0', 'runs as non-root');
    assert.match(dockerfile, /^ENTRYPOINT \["node", "\/app\/bin\/spillway\.js"\]$/m);
  });

  it('copies every directory the runtime reads (compiled code, bin, proto, dashboard page) into the image', () => {
    for (const dir of ['dist', 'bin', 'proto', 'dashboard', 'node_modules']) {
      assert.match(dockerfile, new RegExp(`^COPY --from=build /app/${dir} \\./${dir}$`, 'm'), dir);
    }
  });

  it('EXPOSEs every port the manifests bind', () => {
    const exposed = new Set(
      [...dockerfile.matchAll(/^EXPOSE (.+)$/gm)].flatMap((m) => m[1]!.split(/\s+/).map(Number)),
    );
    for (const { container } of spillwayContainers()) {
      for (const port of container.ports ?? [])
        assert.ok(exposed.has(port.containerPort), String(port.containerPort));
    }
  });
});
