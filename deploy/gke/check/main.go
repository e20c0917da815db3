// Command check decodes every Kubernetes manifest under the given directories strictly into
// the official API types (k8s.io/api, sigs.k8s.io/jobset): an unknown or misspelled field, a
// wrong type or an unknown kind fails, naming the file, the document and the field. With
// -flags, the command lines the pods run are checked against the built binaries (args.go).
//
//	go run . ../                        # exits 1 on the first bad document, 0 when all decode
//	go run . -flags ../../../build/bin ../
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	jobsetv1 "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	"sigs.k8s.io/yaml"
)

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// target returns an empty object of the document's kind.
func target(t typeMeta) (any, error) {
	switch t.APIVersion + "/" + t.Kind {
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "v1/PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}, nil
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "jobset.x-k8s.io/v1alpha2/JobSet":
		return &jobsetv1.JobSet{}, nil
	}
	return nil, fmt.Errorf("kind %s/%s is not one this check knows", t.APIVersion, t.Kind)
}

// checkFile decodes every document of `path`; with a checker (-flags) it also checks the pods'
// command lines. Returns the documents decoded and the command lines checked.
func checkFile(path string, args *argChecker) (int, int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	n, lines := 0, 0
	for i, doc := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var t typeMeta
		if err := yaml.Unmarshal(doc, &t); err != nil {
			return n, lines, fmt.Errorf("%s document %d: %v", path, i+1, err)
		}
		obj, err := target(t)
		if err != nil {
			return n, lines, fmt.Errorf("%s document %d: %v", path, i+1, err)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			return n, lines, fmt.Errorf("%s document %d (%s): %v", path, i+1, t.Kind, err)
		}
		n++
		if args != nil {
			checked, err := args.checkPods(fmt.Sprintf("%s document %d", path, i+1), obj)
			lines += checked
			if err != nil {
				return n, lines, err
			}
		}
	}
	return n, lines, nil
}

func stripComments(doc []byte) []byte {
	var out []string
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			out = append(out, line)
		}
	}
	return []byte(strings.Join(out, "\n"))
}

func main() {
	binDir := flag.String("flags", "", "folder of the built meshrun binaries: check the pods' command lines against them")
	flag.Parse()
	if flag.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: check [-flags BINDIR] <directory or file>...")
		os.Exit(2)
	}
	var args *argChecker
	if *binDir != "" {
		args = &argChecker{binDir: *binDir, known: map[string]map[string]bool{}}
	}
	total := 0
	for _, arg := range flag.Args() {
		files, _ := filepath.Glob(filepath.Join(arg, "*.yaml"))
		if strings.HasSuffix(arg, ".yaml") {
			files = []string{arg}
		}
		if len(files) == 0 {
			fmt.Fprintf(os.Stderr, "no *.yaml in %s\n", arg)
			os.Exit(1)
		}
		for _, f := range files {
			n, lines, err := checkFile(f, args)
			if err != nil {
				fmt.Fprintln(os.Stderr, "FAIL:", err)
				os.Exit(1)
			}
			fmt.Printf("%s: %d documents decode strictly\n", f, n)
			if args != nil {
				fmt.Printf("%s: %d meshrun command lines use known flags, TLS beyond loopback, mounted files\n", f, lines)
			}
			total += n
		}
	}
	fmt.Printf("%d documents ok\n", total)
}
