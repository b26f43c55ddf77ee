//! A fleet whose certificates come from openssl, by the recipe of docs/security.md, works.

use super::*;

/// The recipe of docs/security.md ("Certificates from openssl or your own CA"), run as
/// written: an EC P-256 CA, node certificates naming the fleet's address and
/// `spiffe://ankusa-fleet/node/<id>`, and the admin certificate.
fn openssl_certs(out: &Path, ip: std::net::Ipv4Addr, nodes: u64) {
    let run = |args: &[&str]| {
        let output = std::process::Command::new("openssl")
            .args(args)
            .current_dir(out)
            .output()
            .expect("run openssl (scripts/check.sh installs it)");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "3650",
        "-subj",
        "/CN=fleet CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE,pathlen:0",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    let leaf = |name: &str, usage: &str, san: String| {
        std::fs::write(
            out.join(format!("{name}.ext")),
            format!(
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
                 extendedKeyUsage={usage}\nsubjectAltName={san}\n"
            ),
        )
        .expect("write ext");
        run(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN=ankusa-fleet {name}"),
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            "365",
            "-extfile",
            &format!("{name}.ext"),
        ]);
    };
    for id in 1..=nodes {
        leaf(
            &format!("node{id}"),
            "serverAuth,clientAuth",
            format!("IP:{ip},URI:spiffe://{CLUSTER_ID}/node/{id}"),
        );
    }
    leaf(
        "admin",
        "clientAuth",
        format!("URI:spiffe://{CLUSTER_ID}/admin"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_openssl_certificates_with_the_identities_works() {
    init_tracing();
    let fleet = Fleet::start_with_certs(3, "", |out, ip| openssl_certs(out, ip, 3));
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    fleet
        .commit_claims(&[1, 2, 3], TENANT, &keys("openssl", 6), 2)
        .await;
    fleet
        .assert_duplicates(leader, TENANT, &keys("openssl", 6), 2)
        .await;
    let status = cli_status(&fleet, leader).await;
    assert_eq!((status.leader_id, status.members.len()), (leader, 3));
    let node = [1, 2, 3].into_iter().find(|id| *id != leader).expect("one");
    let answers = every_admin_call(
        &fleet.nodes[&leader].spec.raft_addr,
        tls_as(&fleet, &format!("node{node}")),
    )
    .await;
    let (_, save) = &answers[0];
    assert_eq!(
        save.as_ref().expect_err("a node's backup").code(),
        tonic::Code::PermissionDenied
    );
}
