package main

// The checks on what the manifests run, beyond their schema (-flags BINDIR): every command
// line of a meshrun binary (container command+args and exec probes) uses only flags that
// binary's --helpfull lists, no meshrun server listens beyond loopback in plaintext (it would
// refuse to start: rpc/tls_credentials.cc CheckPlaintextBind), every $(VAR) a command
// line or env value uses is defined before, and every file flag points into a mounted volume.

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	jobsetv1 "sigs.k8s.io/jobset/api/jobset/v1alpha2"
)

// Flags whose value is a file or directory the process reads or writes: they must lie under
// one of the container's volume mounts (certificates, tokens and state come from volumes).
var mountedFlags = []string{"tls_cert", "tls_key", "tls_ca", "auth_tokens_file", "token_file", "state_dir"}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
var helpFlag = regexp.MustCompile(`(?m)^\s+--([A-Za-z0-9_]+) `)

type argChecker struct {
	binDir string
	known  map[string]map[string]bool // binary name -> its flags
}

// podSpecs returns the pod templates of a decoded object, named for messages.
func podSpecs(obj any) map[string]*corev1.PodSpec {
	out := map[string]*corev1.PodSpec{}
	switch o := obj.(type) {
	case *appsv1.Deployment:
		out["Deployment "+o.Name] = &o.Spec.Template.Spec
	case *jobsetv1.JobSet:
		for i := range o.Spec.ReplicatedJobs {
			rj := &o.Spec.ReplicatedJobs[i]
			out["JobSet "+o.Name+" job "+rj.Name] = &rj.Template.Spec.Template.Spec
		}
	}
	return out
}

// flagsOf lists the flags `binary --helpfull` documents (absl prints "  --name (...)").
func (c *argChecker) flagsOf(binary string) (map[string]bool, error) {
	if f, ok := c.known[binary]; ok {
		return f, nil
	}
	path := filepath.Join(c.binDir, binary)
	out, _ := exec.Command(path, "--helpfull").CombinedOutput() // absl exits 1 after help
	flags := map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 || !flags["tls_cert"] {
		return nil, fmt.Errorf("%s --helpfull listed no meshrun flags (is it built? -flags names the folder of the binaries): %.200s", path, out)
	}
	c.known[binary] = flags
	return flags, nil
}

// parseFlags maps each --name[=value] of argv to its value ("" for a bare flag), stopping at
// "--"; positional words (a CLI command and its operands) are skipped.
func parseFlags(argv []string) (map[string]string, []string) {
	values := map[string]string{}
	var order []string
	for _, a := range argv {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		values[name] = value
		order = append(order, name)
	}
	return values, order
}

func isLoopback(hostPort string) bool {
	host := hostPort
	if strings.HasPrefix(host, "[") {
		host = strings.TrimPrefix(strings.SplitN(host, "]", 2)[0], "[")
	} else if i := strings.LastIndex(host, ":"); i >= 0 {
		host = host[:i]
	}
	return host == "localhost" || host == "::1" || strings.HasPrefix(host, "127.")
}

// checkArgv checks one command line of container `where`; server: it is the container's own
// process (a probe's command line is a client and listens nowhere).
func (c *argChecker) checkArgv(where string, argv []string, ctr *corev1.Container, server bool) error {
	if len(argv) == 0 {
		return nil
	}
	binary := filepath.Base(argv[0])
	if !strings.HasPrefix(binary, "meshrun") {
		return nil
	}
	flags, err := c.flagsOf(binary)
	if err != nil {
		return err
	}
	values, order := parseFlags(argv[1:])
	for _, name := range order {
		if !flags[name] && !(strings.HasPrefix(name, "no") && flags[name[2:]]) {
			return fmt.Errorf("%s: %s has no flag --%s (see %s --helpfull)", where, binary, name, binary)
		}
	}
	if _, ok := values["insecure"]; ok {
		return fmt.Errorf("%s: --insecure turns off all access control; give the TLS flags instead (docs/security.md)", where)
	}
	tls := values["tls_cert"] != "" && values["tls_key"] != "" && values["tls_ca"] != ""
	for _, listen := range []string{"listen", "http_listen"} {
		if v, ok := values[listen]; ok && server && !tls && !isLoopback(v) {
			return fmt.Errorf("%s: --%s=%s in plaintext: %s refuses to start without --tls_cert, --tls_key and --tls_ca (docs/security.md)", where, listen, v, binary)
		}
	}
	for _, name := range mountedFlags {
		v, ok := values[name]
		if !ok || v == "" {
			continue
		}
		mounted := false
		for _, m := range ctr.VolumeMounts {
			if v == m.MountPath || strings.HasPrefix(v, strings.TrimSuffix(m.MountPath, "/")+"/") {
				mounted = true
			}
		}
		if !mounted {
			return fmt.Errorf("%s: --%s=%s lies in no volume mount of container %s", where, name, v, ctr.Name)
		}
	}
	return nil
}

// checkVars: a $(VAR) in command or args must be an env var of the container; one in an env
// value must be defined earlier in the list (Kubernetes leaves others unexpanded, silently).
func checkVars(where string, ctr *corev1.Container) error {
	defined := map[string]bool{}
	for _, e := range ctr.Env {
		for _, m := range varRef.FindAllStringSubmatch(e.Value, -1) {
			if !defined[m[1]] {
				return fmt.Errorf("%s: env %s uses $(%s), not defined before it", where, e.Name, m[1])
			}
		}
		defined[e.Name] = true
	}
	for _, a := range append(append([]string{}, ctr.Command...), ctr.Args...) {
		for _, m := range varRef.FindAllStringSubmatch(a, -1) {
			if !defined[m[1]] {
				return fmt.Errorf("%s: %q uses $(%s), which is not in the container's env", where, a, m[1])
			}
		}
	}
	return nil
}

// checkPods runs every check on the pod templates of one decoded object; returns how many
// meshrun command lines it checked.
func (c *argChecker) checkPods(prefix string, obj any) (int, error) {
	n := 0
	specs := podSpecs(obj)
	names := make([]string, 0, len(specs))
	for name := range specs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		spec := specs[name]
		ctrs := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
		for i := range ctrs {
			ctr := &ctrs[i]
			where := fmt.Sprintf("%s %s container %s", prefix, name, ctr.Name)
			if err := checkVars(where, ctr); err != nil {
				return n, err
			}
			argv := append(append([]string{}, ctr.Command...), ctr.Args...)
			if err := c.checkArgv(where, argv, ctr, true); err != nil {
				return n, err
			}
			n++
			values, _ := parseFlags(argv)
			tls := values["tls_ca"] != ""
			for kind, p := range map[string]*corev1.Probe{"readiness": ctr.ReadinessProbe,
				"liveness": ctr.LivenessProbe, "startup": ctr.StartupProbe} {
				if p != nil && p.GRPC != nil && tls {
					return n, fmt.Errorf("%s %s probe: kubelet's gRPC probes are plaintext and this server speaks TLS only; use an exec probe running `meshrun health` with TLS flags", where, kind)
				}
				if p == nil || p.Exec == nil {
					continue
				}
				// Exec probes run without a shell and without $(VAR) expansion.
				for _, a := range p.Exec.Command {
					if varRef.MatchString(a) {
						return n, fmt.Errorf("%s %s probe: %q: exec probes do not expand $(VAR)", where, kind, a)
					}
				}
				if err := c.checkArgv(where+" "+kind+" probe", p.Exec.Command, ctr, false); err != nil {
					return n, err
				}
				n++
			}
		}
	}
	return n, nil
}
