//! TLS with rustls (ring): for clients on `--tls-port`, and for the links
//! to cluster peers with `--tls-cluster yes`. The certificate, key and CA
//! files are read at start and again when `CONFIG SET` changes one of them
//! (or `tls-auth-clients`): new connections get the new configuration,
//! established ones keep theirs. A change that does not load is refused
//! and the configuration in force stays.

use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// `tls-auth-clients`: whether clients must show a certificate the CA
/// signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthClients {
    /// Required (Redis's default).
    Yes,
    /// Not asked for.
    No,
    /// Checked when shown, not required.
    Optional,
}

impl AuthClients {
    fn parse(s: &str) -> Result<AuthClients, String> {
        match s.to_ascii_lowercase().as_str() {
            "yes" => Ok(AuthClients::Yes),
            "no" => Ok(AuthClients::No),
            "optional" => Ok(AuthClients::Optional),
            _ => Err(format!(
                "tls-auth-clients must be yes, no or optional, not '{s}'"
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            AuthClients::Yes => "yes",
            AuthClients::No => "no",
            AuthClients::Optional => "optional",
        }
    }
}

/// The settings the configurations are built from.
#[derive(Clone, Debug)]
struct Files {
    cert: String,
    key: String,
    ca: String,
    auth_clients: AuthClients,
}

/// The configurations in force, and what they were built from.
struct Built {
    files: Files,
    server: Arc<ServerConfig>,
    /// For peer links: this node's certificate, the CA as roots.
    client: Option<Arc<ClientConfig>>,
}

/// TLS for this server.
pub struct Tls {
    /// `--tls-port` (0: no TLS listener).
    pub port: u16,
    /// `--tls-cluster`: peer links use TLS.
    pub cluster: bool,
    built: RwLock<Built>,
    changing: std::sync::Mutex<()>,
}

/// What TLS is built from: the `--tls-*` flags.
#[derive(Clone, Debug, Default)]
pub struct TlsSettings {
    /// `--tls-port` (0: no TLS listener).
    pub port: u16,
    /// `--tls-cluster`: peer links use TLS.
    pub cluster: bool,
    /// `--tls-cert-file`.
    pub cert_file: Option<std::path::PathBuf>,
    /// `--tls-key-file`.
    pub key_file: Option<std::path::PathBuf>,
    /// `--tls-ca-cert-file`.
    pub ca_cert_file: Option<std::path::PathBuf>,
    /// `--tls-auth-clients`: yes, no or optional.
    pub auth_clients: String,
}

impl Tls {
    /// TLS as the settings ask (`None` when neither a TLS port nor TLS peer
    /// links are asked for); `Err` when the files do not load.
    pub fn new(settings: &TlsSettings) -> Result<Option<Tls>, String> {
        if settings.port == 0 && !settings.cluster {
            return Ok(None);
        }
        let files = Files {
            cert: path_text(&settings.cert_file),
            key: path_text(&settings.key_file),
            ca: path_text(&settings.ca_cert_file),
            auth_clients: AuthClients::parse(&settings.auth_clients)?,
        };
        let built = build(files, settings.cluster)?;
        Ok(Some(Tls {
            port: settings.port,
            cluster: settings.cluster,
            built: RwLock::new(built),
            changing: std::sync::Mutex::new(()),
        }))
    }

    /// The server configuration for a connection accepted now.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.read().server)
    }

    /// The client configuration for a peer link opened now (`None`
    /// without `--tls-cluster`).
    pub fn peer_config(&self) -> Option<Arc<ClientConfig>> {
        self.read().client.clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Built> {
        self.built.read().unwrap_or_else(|e| e.into_inner())
    }

    /// CONFIG GET: the TLS settings and their values.
    pub fn params(&self) -> Vec<(String, String)> {
        let files = self.read().files.clone();
        vec![
            ("tls-cert-file".into(), files.cert),
            ("tls-key-file".into(), files.key),
            ("tls-ca-cert-file".into(), files.ca),
            (
                "tls-auth-clients".into(),
                files.auth_clients.name().to_string(),
            ),
        ]
    }

    /// CONFIG SET of TLS settings (`name`, `value` pairs, names in lower
    /// case), loaded together: the configuration changes only if the new
    /// files load.
    pub fn set(&self, changes: &[(String, String)]) -> Result<(), String> {
        // One change at a time, from reading the files in force to the swap.
        let _one = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let mut files = self.read().files.clone();
        for (name, value) in changes {
            match name.as_str() {
                "tls-cert-file" => files.cert = value.clone(),
                "tls-key-file" => files.key = value.clone(),
                "tls-ca-cert-file" => files.ca = value.clone(),
                "tls-auth-clients" => files.auth_clients = AuthClients::parse(value)?,
                _ => return Err(format!("not a TLS setting: {name}")),
            }
        }
        let built = build(files, self.cluster)?;
        *self.built.write().unwrap_or_else(|e| e.into_inner()) = built;
        Ok(())
    }
}

fn path_text(p: &Option<std::path::PathBuf>) -> String {
    p.as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// Loads the files into a server configuration (and, for peer links, a
/// client one).
fn build(files: Files, cluster: bool) -> Result<Built, String> {
    if files.cert.is_empty() || files.key.is_empty() {
        return Err("TLS needs tls-cert-file and tls-key-file".into());
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("tls-cert-file {}: {e}", files.cert))?;
    if certs.is_empty() {
        return Err(format!("tls-cert-file {}: no certificate", files.cert));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("tls-key-file {}: {e}", files.key))?;
    let roots = if files.ca.is_empty() {
        None
    } else {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&files.ca)
            .map_err(|e| format!("tls-ca-cert-file {}: {e}", files.ca))?
        {
            let cert = cert.map_err(|e| format!("tls-ca-cert-file {}: {e}", files.ca))?;
            roots
                .add(cert)
                .map_err(|e| format!("tls-ca-cert-file {}: {e}", files.ca))?;
        }
        Some(Arc::new(roots))
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let needs_ca = |why: &str| format!("{why} needs tls-ca-cert-file");
    let verifier = match files.auth_clients {
        AuthClients::No => WebPkiClientVerifier::no_client_auth(),
        AuthClients::Yes | AuthClients::Optional => {
            let roots = roots
                .clone()
                .ok_or_else(|| needs_ca("tls-auth-clients yes|optional"))?;
            let builder = WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(&provider));
            let builder = if files.auth_clients == AuthClients::Optional {
                builder.allow_unauthenticated()
            } else {
                builder
            };
            builder
                .build()
                .map_err(|e| format!("client verifier: {e}"))?
        }
    };
    let server = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs.clone(), key.clone_key())
        .map_err(|e| format!("tls-cert-file / tls-key-file: {e}"))?;
    let client = if cluster {
        let roots = roots.ok_or_else(|| needs_ca("tls-cluster yes"))?;
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| format!("tls-cert-file / tls-key-file: {e}"))?;
        Some(Arc::new(config))
    } else {
        None
    };
    Ok(Built {
        files,
        server: Arc::new(server),
        client,
    })
}
