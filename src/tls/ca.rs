//! The CA a drill mints for itself (rcgen): one CA certificate, one server certificate for
//! every broker drill starts (SANs 127.0.0.1, localhost and the scenario's names) and one client
//! certificate for mutual TLS (and an expired broker certificate, for `bad_certificate`), written as PEM files into the drill's work folder. Keys are
//! files of mode 0600; nothing is kept after the work folder goes.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

/// The files of a minted CA, as a broker and an engine are given them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_file: PathBuf,
    pub server_cert_file: PathBuf,
    pub server_key_file: PathBuf,
    pub client_cert_file: PathBuf,
    pub client_key_file: PathBuf,
    /// The broker's certificate again, from the same CA and with the same names, but expired
    /// (valid in 2020 only): what a link presents for `bad_certificate` with `certificate:
    /// expired`.
    pub expired_cert_file: PathBuf,
    pub expired_key_file: PathBuf,
}

/// A CA minted for one drill.
#[derive(Debug, Clone)]
pub struct DrillCa {
    pub files: TlsFiles,
}

impl DrillCa {
    /// Mints a CA named `who` into `dir` (created), with a server certificate valid for
    /// 127.0.0.1, localhost and `names`, and a client certificate.
    pub fn mint(dir: &Path, who: &str, names: &[String]) -> Result<DrillCa, String> {
        mint(dir, who, names).map_err(|e| {
            format!(
                "cannot mint the drill's TLS certificates in {}: {e}",
                dir.display()
            )
        })
    }
}

fn mint(dir: &Path, who: &str, names: &[String]) -> Result<DrillCa, Box<dyn std::error::Error>> {
    fs::create_dir_all(dir)?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = name(&format!("{who} CA"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut sans = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    sans.extend(
        names
            .iter()
            .filter(|n| !sans.contains(n))
            .cloned()
            .collect::<Vec<_>>(),
    );
    let mut expired = CertificateParams::new(sans.clone())?;
    expired.distinguished_name = name(&format!("{who} broker (expired)"));
    expired.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    expired.use_authority_key_identifier_extension = true;
    expired.not_before = rcgen::date_time_ymd(2020, 1, 1);
    expired.not_after = rcgen::date_time_ymd(2020, 12, 31);
    let expired_key = KeyPair::generate()?;
    let expired_cert = expired.signed_by(&expired_key, &ca)?;

    let mut server = CertificateParams::new(sans)?;
    server.distinguished_name = name(&format!("{who} broker"));
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server.use_authority_key_identifier_extension = true;
    let server_key = KeyPair::generate()?;
    let server_cert = server.signed_by(&server_key, &ca)?;

    let mut client = CertificateParams::new(Vec::<String>::new())?;
    client.distinguished_name = name(&format!("{who} engine"));
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    client.use_authority_key_identifier_extension = true;
    let client_key = KeyPair::generate()?;
    let client_cert = client.signed_by(&client_key, &ca)?;

    let files = TlsFiles {
        ca_file: dir.join("ca.pem"),
        server_cert_file: dir.join("server.pem"),
        server_key_file: dir.join("server-key.pem"),
        client_cert_file: dir.join("client.pem"),
        client_key_file: dir.join("client-key.pem"),
        expired_cert_file: dir.join("server-expired.pem"),
        expired_key_file: dir.join("server-expired-key.pem"),
    };
    fs::write(&files.ca_file, ca.pem())?;
    fs::write(&files.server_cert_file, server_cert.pem())?;
    fs::write(&files.client_cert_file, client_cert.pem())?;
    secret(&files.server_key_file, &server_key.serialize_pem())?;
    secret(&files.client_key_file, &client_key.serialize_pem())?;
    fs::write(&files.expired_cert_file, expired_cert.pem())?;
    secret(&files.expired_key_file, &expired_key.serialize_pem())?;
    Ok(DrillCa { files })
}

fn name(common: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "drill");
    dn.push(DnType::CommonName, common);
    dn
}

/// A key file only its owner reads.
pub(crate) fn secret(path: &Path, pem: &str) -> std::io::Result<()> {
    let _ = fs::remove_file(path);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(pem.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_minted_ca_signs_a_server_and_a_client_and_keeps_keys_private() {
        let dir = tempfile::tempdir().unwrap();
        let ca = DrillCa::mint(dir.path(), "test", &["broker.drill".to_string()]).unwrap();
        for f in [
            &ca.files.ca_file,
            &ca.files.server_cert_file,
            &ca.files.client_cert_file,
        ] {
            assert!(
                fs::read_to_string(f)
                    .unwrap()
                    .starts_with("-----BEGIN CERTIFICATE-----")
            );
        }
        for f in [&ca.files.server_key_file, &ca.files.client_key_file] {
            let mode = fs::metadata(f).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", f.display());
        }
        // The client side built from it accepts only this CA (checked for real in the tests
        // of `client`).
        crate::tls::ClientTls::new(&crate::tls::TlsConfig::trusting(&ca.files.ca_file)).unwrap();
    }
}
